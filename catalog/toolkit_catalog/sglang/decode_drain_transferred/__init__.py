"""slime's fix of SGLang's disaggregated decode scheduler, ported as a serving-toolkit patch (see
README.md). A pure code fix: the patched SGLang imports nothing from this package."""
