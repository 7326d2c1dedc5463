#!/usr/bin/env python3
"""Build the compiled superlinear CPU kernels once, into the toolkit cache, before the tests run.

    ~/.cache/toolkit/venvs/dev/bin/python scripts/build_kernels.py

scripts/test.sh's setup runs it, so no test pays a C++ compile (the kernels are otherwise built at
first use: ``toolkit.kernels.superlinear.gather.native_build``). A machine without a C++ compiler is not an
error here: the kernels fall back to their torch paths, and this says so in one line.
"""

from __future__ import annotations

import sys
import time


def main() -> int:
    start = time.monotonic()
    from toolkit.kernels.superlinear.gather import native, native_spans

    if native.compiler() is None:
        print("compiled kernels: no C++ compiler on PATH; the torch paths will run", file=sys.stderr)
        return 0
    built = []
    for name, module in (("search", native), ("spans", native_spans)):
        if module.library() is None:
            print(f"error: compiled kernel {name} not built: {module.why_not()}", file=sys.stderr)
            return 1
        built.append(name)
    print(f"compiled kernels ready ({', '.join(built)}) in {native.cache_dir()} "
          f"({time.monotonic() - start:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
