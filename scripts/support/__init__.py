"""What the scripts share with the tests: an HF reference implementation, engine venvs, private patched
vLLM copies, servers for benchmarks, request helpers.

Imported as ``scripts.support`` with the repository root on ``sys.path`` (``scripts`` is a namespace
package). The tests may import from here; nothing here, or anywhere under scripts/, imports ``tests``
(tests/architecture/test_scripts.py).
"""
