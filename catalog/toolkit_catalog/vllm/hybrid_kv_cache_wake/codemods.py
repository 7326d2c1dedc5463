"""The edit, on ``vllm/v1/worker/gpu_model_runner.py``.

``GPUModelRunner.init_fp8_kv_scales`` (run by ``wake_up(tags=["kv_cache"])`` with a quantized KV
cache) zeroes every KV-cache entry as one tensor. Hybrid models (Mamba, DeltaNet) keep a list of
tensors per layer, so waking them raises ``AttributeError: 'list' object has no attribute 'zero_'``.
SkyRL ``exec``'s a string-replaced copy of the method with vllm-project/vllm#41602's loop; here the
loop statement alone is replaced by that one::

    for cache_entry in kv_caches:  # toolkit:hybrid-kv-cache-wake
        if cache_entry is None:
            continue
        # Hybrid models (Mamba, DeltaNet) store per-layer state as a
        # list of tensors rather than a single tensor.
        if isinstance(cache_entry, list):
            for tensor in cache_entry:
                tensor.zero_()
        else:
            cache_entry.zero_()

The rest of the method (the FP8 scale reset) stays the release's own. The anchor is the loop
``for cache_tensor in kv_caches:`` whose body is ``if cache_tensor is not None: cache_tensor.zero_()``,
exactly one in the method; vLLM 0.27's own loop (the fix) does not match it.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import AnchoredTransformer, in_method

RUNNER = "GPUModelRunner"
METHOD = "init_fp8_kv_scales"

ZERO_EACH_TENSOR = m.For(
    target=m.Name("cache_tensor"), iter=m.Name("kv_caches"),
    body=m.IndentedBlock(body=[m.If(
        test=m.Comparison(left=m.Name("cache_tensor"),
                          comparisons=[m.ComparisonTarget(operator=m.IsNot(), comparator=m.Name("None"))]),
        body=m.IndentedBlock(body=[m.SimpleStatementLine(body=[m.Expr(value=m.Call(
            func=m.Attribute(value=m.Name("cache_tensor"), attr=m.Name("zero_")), args=[]))])]),
        orelse=None)]))

UPSTREAM_LOOP = '''\
for cache_entry in kv_caches:
    if cache_entry is None:
        continue
    # Hybrid models (Mamba, DeltaNet) store per-layer state as a
    # list of tensors rather than a single tensor.
    if isinstance(cache_entry, list):
        for tensor in cache_entry:
            tensor.zero_()
    else:
        cache_entry.zero_()
'''


class GPUModelRunnerTransformer(AnchoredTransformer):
    INSIDE = {RUNNER: frozenset({METHOD})}
    ANCHORS = {"zero-loop": f"`for cache_tensor in kv_caches:` zeroing each entry as a tensor in {RUNNER}.{METHOD}"}

    @m.leave(m.FunctionDef(name=m.Name(METHOD)))
    @in_method(RUNNER, METHOD)
    def zero_list_entries(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        body = list(updated_node.body.body)
        found = [i for i, statement in enumerate(body) if m.matches(statement, ZERO_EACH_TENSOR)]
        if len(found) != 1:
            return updated_node
        self.hit("zero-loop")
        (at,) = found
        body[at] = self.marked_statement(UPSTREAM_LOOP).with_changes(leading_lines=body[at].leading_lines)
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))
