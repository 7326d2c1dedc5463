"""prime-rl's replacement of vLLM's ``DPCoordinator._wait_for_zmq_addrs`` (its startup timeout),
ported (see codemods.py). A pure code fix: the patched vLLM imports nothing from the catalog."""
