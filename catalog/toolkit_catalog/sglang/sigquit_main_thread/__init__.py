"""verl's fix of SGLang's ``_set_envs_and_config``, ported as a serving-toolkit patch (see README.md).
A pure code fix: the patched SGLang imports nothing from this package."""
