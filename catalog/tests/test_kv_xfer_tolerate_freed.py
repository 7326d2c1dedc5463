"""The edit on snippets in the two shapes vLLM's releases have (the real files are the conformance
test's). Runs without vLLM: toolkit.testing.assert_codemod transforms the snippet."""

from __future__ import annotations

import pytest

from toolkit_catalog.vllm.kv_xfer_tolerate_freed.codemods import SchedulerTransformer
from toolkit.testing import assert_codemod

RELPATH = "v1/core/sched/scheduler.py"
PATCH_ID = "kv-xfer-tolerate-freed"

# {fetch_stage}: vLLM 0.32 added a line to the recving loop; 0.24-0.31 do not have it.
BEFORE = '''
class Scheduler(SchedulerInterface):
    def _update_from_kv_xfer_finished(self, kv_connector_output: KVConnectorOutput):
        if self.connector is not None:
            self.connector.update_connector_output(kv_connector_output)

        # KV Connector:: update recv and send status from last step.
        for req_id in kv_connector_output.finished_recving or ():
            logger.debug("Finished recving KV transfer for request %s", req_id)
            assert req_id in self.requests
            req = self.requests[req_id]
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.finished_recving_kv_req_ids.add(req_id){fetch_stage}
            else:
                assert RequestStatus.is_finished(req.status)
                self._free_blocks(self.requests[req_id])
        for req_id in kv_connector_output.finished_sending or ():
            logger.debug("Finished sending KV transfer for request %s", req_id)
            assert req_id in self.requests
            self._free_blocks(self.requests[req_id])

    def finish_requests(self, request_ids, finished_status):
        for req_id in request_ids:
            assert req_id in self.requests
'''

AFTER = '''
class Scheduler(SchedulerInterface):
    def _update_from_kv_xfer_finished(self, kv_connector_output: KVConnectorOutput):
        if self.connector is not None:
            self.connector.update_connector_output(kv_connector_output)

        # KV Connector:: update recv and send status from last step.
        for req_id in kv_connector_output.finished_recving or ():
            logger.debug("Finished recving KV transfer for request %s", req_id)
            if req_id not in self.requests:  # toolkit:kv-xfer-tolerate-freed
                continue
            req = self.requests[req_id]
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.finished_recving_kv_req_ids.add(req_id){fetch_stage}
            else:
                assert RequestStatus.is_finished(req.status)
                self._free_blocks(self.requests[req_id])
        for req_id in kv_connector_output.finished_sending or ():
            logger.debug("Finished sending KV transfer for request %s", req_id)
            if req_id not in self.requests:  # toolkit:kv-xfer-tolerate-freed
                continue
            self._free_blocks(self.requests[req_id])

    def finish_requests(self, request_ids, finished_status):
        for req_id in request_ids:
            assert req_id in self.requests
'''

FETCH_STAGE = "\n                self._set_kv_fetch_stage(req, KV_FETCH_COMPLETED_WAITING)"


@pytest.mark.parametrize(("fetch_stage", "engine_version"), [("", "0.31.0"), (FETCH_STAGE, "0.32.0")],
                         ids=["vllm-0.24-0.31", "vllm-0.32-0.33"])
def test_each_loop_skips_a_freed_request_and_the_rest_of_the_method_stays(fetch_stage, engine_version):
    # the other method's assert is not ours to touch; 0.32's added line stays where vLLM put it
    assert_codemod(SchedulerTransformer, BEFORE.format(fetch_stage=fetch_stage),
                   AFTER.format(fetch_stage=fetch_stage), engine_version=engine_version, relpath=RELPATH,
                   patch_id=PATCH_ID)


def test_a_loop_without_the_assert_fails_on_its_anchor_instead_of_a_silent_no_op():
    # a release that changed the sending loop: the apply must stop, not patch half the method
    before = BEFORE.format(fetch_stage="").replace(
        "            assert req_id in self.requests\n            self._free_blocks",
        "            self._free_blocks")
    with pytest.raises(AssertionError, match="finished_sending"):
        assert_codemod(SchedulerTransformer, before, before, relpath=RELPATH, patch_id=PATCH_ID)
