"""custom-all-reduce-v2-tms-cudagraph (NeMo-RL) on a snippet in SGLang 0.5.10-0.5.14's shape (the real
files are test_conformance.py's). Runs without SGLang.

No behaviour test here: custom all-reduce v2 runs CUDA kernels over IPC buffers of several GPUs,
captured into CUDA graphs; nothing of it runs on a CPU."""

from __future__ import annotations

import pytest

from toolkit.testing import assert_codemod
from toolkit_catalog.sglang.custom_all_reduce_v2_tms_cudagraph.codemods import CustomAllReduceV2Transformer
from toolkit_catalog.sglang.custom_all_reduce_v2_tms_cudagraph.patch import PATCH

RELPATH = "srt/distributed/device_communicators/custom_all_reduce_v2.py"

BEFORE = '''
import torch
{envs}from sglang.srt.utils import is_sm100_supported{utils_more}


class CustomAllReduceV2:
    def __init__(self, group, device, max_size=2**30):
        self.override_algo: Optional[AllReduceAlgo] = None{tms}
        self.obj = get_custom_all_reduce_cls()(rank=rank)

    @contextmanager
    def capture(self):
        try:
            self.obj.set_cuda_graph_capture({flag})
            yield
        finally:
            self.obj.set_cuda_graph_capture(False)

    def custom_all_reduce(self, input: torch.Tensor) -> torch.Tensor:
        if is_in_tc_piecewise_cuda_graph():
            try:
                self.obj.set_cuda_graph_capture(False)
                return self._all_reduce(input)
            finally:
                self.obj.set_cuda_graph_capture({flag})
        return self._all_reduce(input)
'''

MARK = "  # toolkit:custom-all-reduce-v2-tms-cudagraph"
SHAPES = {"sglang-0.5.10-0.5.13": (", log_info_on_rank0", "0.5.13"), "sglang-0.5.14": ("", "0.5.14")}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=list(SHAPES))
def test_the_capture_flag_follows_the_memory_saver_setting(shape):
    utils_more, version = shape
    before = BEFORE.format(envs="", utils_more=utils_more, tms="", flag="True")
    after = BEFORE.format(envs=f"from sglang.srt.environ import envs{MARK}\n", utils_more=utils_more,
                          tms=f"\n        self.tms_cudagraph = envs.SGLANG_MEMORY_SAVER_CUDA_GRAPH.get(){MARK}",
                          flag="not self.tms_cudagraph").replace(
        "set_cuda_graph_capture(not self.tms_cudagraph)", f"set_cuda_graph_capture(not self.tms_cudagraph){MARK}")
    assert_codemod(CustomAllReduceV2Transformer, before, after, engine="sglang", engine_version=version,
                   relpath=RELPATH, patch_id=PATCH.id)


def test_sglang_0_5_15s_fixed_class_fails_on_its_anchor_and_is_not_needed():
    fixed = BEFORE.format(envs="from sglang.srt.environ import envs\n", utils_more="",
                          tms="\n        self.tms_cudagraph = envs.SGLANG_MEMORY_SAVER_CUDA_GRAPH.get()",
                          flag="not self.tms_cudagraph")
    with pytest.raises(AssertionError, match="capture-flag"):
        assert_codemod(CustomAllReduceV2Transformer, fixed, fixed, engine="sglang", engine_version="0.5.15",
                       relpath=RELPATH, patch_id=PATCH.id)
    assert PATCH.not_needed_on("0.5.15") and not PATCH.not_needed_on("0.5.14")
