"""The edit on snippets in the two shapes SGLang's releases have around it (the real files are the
conformance test's). Runs without SGLang: toolkit.testing.assert_codemod transforms the snippet."""

from __future__ import annotations

import pytest

from toolkit_catalog.sglang.decode_drain_transferred.codemods import DecodeSchedulerTransformer
from toolkit.testing import assert_codemod

RELPATH = "srt/disaggregation/decode.py"
PATCH_ID = "decode-drain-transferred"

# {before}: what each release does first (0.5.23 resolves deferred releases; 0.5.9 does not);
# {interval}: where the polling interval is read from (0.5.9: server_args; 0.5.23: get_disagg()).
BEFORE = '''
class SchedulerDisaggregationDecodeMixin:
    def process_decode_queue(self: Scheduler):{before}
        # try to resume retracted requests if there are enough space for another `num_reserved_decode_tokens` decode steps
        resumed_reqs = self.disagg_decode_prealloc_queue.resume_retracted_reqs()
        self.waiting_queue.extend(resumed_reqs)
        if len(self.disagg_decode_prealloc_queue.retracted_queue) > 0:
            # if there are still retracted requests, we do not allocate new requests
            return

        if not hasattr(self, "polling_count"):
            self.polling_count = 0
            self.polling_interval = {interval}
        alloc_reqs = self.disagg_decode_transfer_queue.pop_transferred()
        self.waiting_queue.extend(alloc_reqs)
'''

AFTER = '''
class SchedulerDisaggregationDecodeMixin:
    def process_decode_queue(self: Scheduler):{before}
        # try to resume retracted requests if there are enough space for another `num_reserved_decode_tokens` decode steps
        resumed_reqs = self.disagg_decode_prealloc_queue.resume_retracted_reqs()
        self.waiting_queue.extend(resumed_reqs)
        if len(self.disagg_decode_prealloc_queue.retracted_queue) > 0:
            # if there are still retracted requests, we do not allocate new requests
            drained_reqs = self.disagg_decode_transfer_queue.pop_transferred()  # toolkit:decode-drain-transferred
            self.waiting_queue.extend(drained_reqs)  # toolkit:decode-drain-transferred
            return

        if not hasattr(self, "polling_count"):
            self.polling_count = 0
            self.polling_interval = {interval}
        alloc_reqs = self.disagg_decode_transfer_queue.pop_transferred()
        self.waiting_queue.extend(alloc_reqs)
'''

SHAPES = {
    "sglang-0.5.9": ("", "self.server_args.disaggregation_decode_polling_interval", "0.5.9"),
    "sglang-0.5.23": ("\n        self.disagg_decode_transfer_queue.resolve_deferred_releases()\n",
                      "get_disagg().disaggregation_decode_polling_interval", "0.5.23"),
}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=list(SHAPES))
def test_completed_transfers_are_drained_before_the_early_return(shape):
    before, interval, version = shape
    assert_codemod(DecodeSchedulerTransformer, BEFORE.format(before=before, interval=interval),
                   AFTER.format(before=before, interval=interval), engine="sglang", engine_version=version,
                   relpath=RELPATH, patch_id=PATCH_ID)


def test_a_block_that_no_longer_returns_at_once_fails_on_its_anchor():
    # a release that changed what happens with retracted requests: stop, do not guess
    before = BEFORE.format(before="", interval="1").replace(
        "            return\n", "            self.polling_count = 0\n", 1)
    with pytest.raises(AssertionError, match="retracted-return"):
        assert_codemod(DecodeSchedulerTransformer, before, before, engine="sglang", relpath=RELPATH,
                       patch_id=PATCH_ID)
