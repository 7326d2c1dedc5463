"""prime-rl's fix of vLLM's ``Scheduler._update_from_kv_xfer_finished``, ported as a serving-toolkit
patch (see README.md). A pure code fix: the patched vLLM imports nothing from this package."""
