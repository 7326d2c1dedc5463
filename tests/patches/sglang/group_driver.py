"""Several serving drivers in one SGLang process; hand back JSON (tests/harness/channel.py).

    <sglang python> group_driver.py MODEL_DIR PART [PART ...]

PART is ``token-ids`` (tests/patches/sglang/token_ids/serving_driver.py), ``token-ids-server-wide``
(the same, then its vanilla cases again under ``TOOLKIT_RETURN_TOKEN_IDS=1``), ``tito``
(tests/patches/sglang/tito/serving_driver.py) or ``splice`` (tests/patches/sglang/tito/splice_driver.py).
Each part runs exactly as its own driver does when run alone (its ``main``, its own serving objects);
they only share the interpreter, whose SGLang import is most of a driver's time. Not a test module:
tests/patches/sglang/group_runs.py runs it once per patch state of a release group.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo: the drivers and the result channel

from tests.harness.channel import write_result  # noqa: E402

PARTS = ("token-ids", "token-ids-server-wide", "tito", "splice")


def main(model: str, parts: list[str]) -> dict:
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        raise SystemExit(f"usage: group_driver.py MODEL {{{'|'.join(PARTS)}}}...; got {parts}")
    result: dict = {}
    for part in parts:
        if part.startswith("token-ids"):
            from tests.patches.sglang.token_ids import serving_driver as token_ids

            result[part] = asyncio.run(token_ids.main(model, server_wide_too=part == "token-ids-server-wide"))
        elif part == "tito":
            from tests.patches.sglang.tito import serving_driver as tito

            result[part] = asyncio.run(tito.main(model))
        else:
            from tests.patches.sglang.tito import splice_driver as splice

            result[part] = asyncio.run(splice.main(model))
    import sglang

    result["sglang_file"] = sglang.__file__  # which copy served: group_runs.py checks it is the group's
    return result


if __name__ == "__main__":
    write_result(main(sys.argv[1], sys.argv[2:]))
