"""The edit, on ``vllm/model_executor/models/radio.py``.

vLLM's ``RadioVisionEncoderLayer`` multiplies its attention and MLP outputs by ``ls1``/``ls2``
(LayerScale), but ``RadioModel.load_weights`` skips those checkpoint entries ("layer-scale entries
that vLLM doesn't use"): explicit values are ignored, and a checkpoint that folded them leaves the
parameters at dummy initialisation. NeMo-RL's fix, structurally: the skip goes, so the entries load
like every other block weight, and before the method returns every LayerScale parameter no
checkpoint entry loaded is set to RADIO's identity factor::

    initializer_factor = self.config.initializer_factor  # toolkit:radio-layerscale-loader
    for name, param in params_dict.items():  # toolkit:radio-layerscale-loader
        if name.endswith((".ls1", ".ls2")) and name not in loaded_params:
            param.data.fill_(initializer_factor)
            loaded_params.add(name)
    return loaded_params

Anchors: the one ``if`` of ``RadioModel.load_weights`` that tests for ``"ls1"`` and only
``continue``s, and the method's final ``return loaded_params``. NeMo-RL's snippet is 29 lines of the
method verbatim (vLLM 0.25.1's); this edit needs only the two statements, which every release has.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import AnchoredTransformer, in_method

MODEL = "RadioModel"
METHOD = "load_weights"

SKIPS_LAYER_SCALE = m.If(body=m.IndentedBlock(body=[m.SimpleStatementLine(body=[m.Continue()])]), orelse=None)
RETURNS = m.SimpleStatementLine(body=[m.Return(value=m.Name("loaded_params"))])

INITIALISE = (
    "initializer_factor = self.config.initializer_factor",
    '''\
for name, param in params_dict.items():
    if name.endswith((".ls1", ".ls2")) and name not in loaded_params:
        param.data.fill_(initializer_factor)
        loaded_params.add(name)
''',
)


def _tests_layer_scale(node: cst.If) -> bool:
    return bool(m.findall(node.test, m.SimpleString('"ls1"')))


class RadioModelTransformer(AnchoredTransformer):
    INSIDE = {MODEL: frozenset({METHOD})}
    ANCHORS = {
        "skip": f"the `if suffix in {{\"ls1\", \"ls2\"}} ...: continue` of {MODEL}.{METHOD}",
        "return": f"the final `return loaded_params` of {MODEL}.{METHOD}",
    }

    @m.leave(m.IndentedBlock())
    @in_method(MODEL, METHOD)
    def load_layer_scale(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
                         ) -> cst.IndentedBlock:
        body = list(updated_node.body)
        skips = [i for i, s in enumerate(body) if m.matches(s, SKIPS_LAYER_SCALE) and _tests_layer_scale(s)]
        if len(skips) != 1:
            return updated_node
        self.hit("skip")  # a second such `if` elsewhere in the method is a second hit: the apply stops
        (at,) = skips
        del body[at]  # its comment line goes with it, as in NeMo-RL's replacement
        return updated_node.with_changes(body=body)

    @m.leave(m.FunctionDef(name=m.Name(METHOD)))
    @in_method(MODEL, METHOD)
    def initialise_the_rest(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        body = list(updated_node.body.body)
        if not body or not m.matches(body[-1], RETURNS):
            return updated_node
        self.hit("return")
        added = [self.marked_statement(code) for code in INITIALISE]
        added[0] = added[0].with_changes(leading_lines=body[-1].leading_lines)
        body[-1:] = [*added, body[-1].with_changes(leading_lines=[])]
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))
