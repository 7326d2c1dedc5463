"""namespace-tool-import-guard (NeMo-RL) on snippets in vLLM's two shapes of the import (0.25-0.31,
and 0.32-0.33 with CustomTool, where NeMo-RL's exact snippet no longer matches), and its behaviour:
the patched imports run against an ``openai.types.responses`` without NamespaceTool (an openai older
than 2.25, built in sys.modules: the environment here has a newer openai) and with it."""

from __future__ import annotations

import sys
import textwrap
import types

import pytest

from toolkit.testing import assert_codemod
from toolkit_catalog.vllm.namespace_tool_import_guard.codemods import ToolParserUtilsTransformer
from toolkit_catalog.vllm.namespace_tool_import_guard.patch import PATCH

RELPATH = "tool_parsers/utils.py"

# {custom}/{choice_custom}: the names vLLM 0.32 added to the import
BEFORE = '''
import json
from openai.types.responses import (
{custom}    FunctionTool,
    NamespaceTool,
{choice_custom}    ToolChoiceFunction,
)
from openai.types.responses.tool import Tool as ResponsesTool


def _is_namespace(tool):
    return isinstance(tool, NamespaceTool)
'''

AFTER = '''
import json
from openai.types.responses import (
{custom}    FunctionTool,
{choice_custom}    ToolChoiceFunction,
)  # toolkit:namespace-tool-import-guard

try:  # toolkit:namespace-tool-import-guard
    from openai.types.responses import NamespaceTool
except ImportError:  # openai < 2.25.0 predates namespace tools

    class NamespaceTool:  # type: ignore[no-redef]
        """Stub: openai<2.25 clients cannot construct namespace tools."""
from openai.types.responses.tool import Tool as ResponsesTool


def _is_namespace(tool):
    return isinstance(tool, NamespaceTool)
'''

SHAPES = {"vllm-0.25-0.31": ("", "", "0.31.0"),
          "vllm-0.32-0.33": ("    CustomTool,\n", "    ToolChoiceCustom,\n", "0.33.0")}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=list(SHAPES))
def test_namespace_tool_leaves_the_import_for_a_guarded_one_and_the_other_names_stay(shape):
    custom, choice_custom, version = shape
    assert_codemod(ToolParserUtilsTransformer, BEFORE.format(custom=custom, choice_custom=choice_custom),
                   AFTER.format(custom=custom, choice_custom=choice_custom), engine_version=version,
                   relpath=RELPATH, patch_id=PATCH.id)


def test_vllm_0_24_without_the_import_fails_on_its_anchor():
    before = BEFORE.format(custom="", choice_custom="").replace("    NamespaceTool,\n", "")
    with pytest.raises(AssertionError, match="import"):
        assert_codemod(ToolParserUtilsTransformer, before, before, relpath=RELPATH, patch_id=PATCH.id)


def _run_patched_imports(responses: types.ModuleType) -> dict:
    """The patched module's code, with ``responses`` as ``openai.types.responses``."""
    code = textwrap.dedent(AFTER.format(custom="", choice_custom="")).replace(
        "from openai.types.responses.tool import Tool as ResponsesTool\n", "")
    saved = {name: sys.modules.get(name) for name in ("openai", "openai.types", "openai.types.responses")}
    package, types_ = types.ModuleType("openai"), types.ModuleType("openai.types")
    package.types, types_.responses = types_, responses  # type: ignore[attr-defined]
    sys.modules.update({"openai": package, "openai.types": types_, "openai.types.responses": responses})
    try:
        namespace: dict = {}
        exec(compile(code, RELPATH, "exec"), namespace)
        return namespace
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _responses(**names) -> types.ModuleType:
    module = types.ModuleType("openai.types.responses")
    module.FunctionTool = type("FunctionTool", (), {})  # type: ignore[attr-defined]
    module.ToolChoiceFunction = type("ToolChoiceFunction", (), {})  # type: ignore[attr-defined]
    for name, value in names.items():
        setattr(module, name, value)
    return module


def test_an_openai_without_namespace_tool_imports_and_nothing_is_a_namespace_tool():
    patched = _run_patched_imports(_responses())
    assert patched["_is_namespace"](patched["FunctionTool"]()) is False
    assert patched["NamespaceTool"].__doc__.startswith("Stub")


def test_an_openai_with_namespace_tool_gets_its_own_class():
    real = type("NamespaceTool", (), {})
    patched = _run_patched_imports(_responses(NamespaceTool=real))
    assert patched["NamespaceTool"] is real and patched["_is_namespace"](real()) is True
