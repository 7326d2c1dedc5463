"""The hint a refusal ends with when the word a user wrote is close to a known one."""

from __future__ import annotations

import difflib
from typing import Sequence


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """ "; did you mean X?" for a near miss among ``choices``, else ""."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""
