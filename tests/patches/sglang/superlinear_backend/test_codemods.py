"""The superlinear-backend codemods (SGLang 0.5.9): golden before/after snippets, missing anchors, and
the real 0.5.9 sources (every anchor once, compiles, and the patched modules do what they should)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from toolkit.patches.sglang.superlinear_backend.patch import PATCH
from tests.harness.fixtures import ensure_source_tree
from toolkit.errors import AnchorError
from toolkit.engine.transform import transform_or_raise

REGISTRY, SERVER_ARGS, COMMON = PATCH.files
MARK = "# toolkit:superlinear-backend"


def patched(edit, before: str, version: str = "0.5.9") -> str:
    return transform_or_raise(PATCH, edit, textwrap.dedent(before), version).after


def test_only_0_5_9_needs_the_patch():
    assert PATCH.supports("0.5.9") and not PATCH.supports("0.5.23")


def test_registry_registers_superlinear_after_the_decorator_factory():
    after = patched(REGISTRY, '''
        import logging

        ATTENTION_BACKENDS = {}


        def register_attention_backend(name):
            def decorator(fn):
                ATTENTION_BACKENDS[name] = fn
                return fn

            return decorator


        @register_attention_backend("torch_native")
        def create_torch_native_backend(runner):
            return runner
    ''')
    assert after == textwrap.dedent(f'''
        import logging
        from toolkit.patches.sglang.superlinear_backend import runtime as _toolkit_superlinear  {MARK}

        ATTENTION_BACKENDS = {{}}


        def register_attention_backend(name):
            def decorator(fn):
                ATTENTION_BACKENDS[name] = fn
                return fn

            return decorator
        register_attention_backend(_toolkit_superlinear.NAME)(_toolkit_superlinear.create)  {MARK}


        @register_attention_backend("torch_native")
        def create_torch_native_backend(runner):
            return runner
    ''')


def test_choices_get_superlinear():
    after = patched(SERVER_ARGS, '''
        import logging

        ATTENTION_BACKEND_CHOICES = [
            "triton",
            "torch_native",
        ]
        LORA_BACKEND_CHOICES = ["triton"]
    ''')
    assert f'ATTENTION_BACKEND_CHOICES.append("superlinear")  {MARK}\nLORA_BACKEND_CHOICES' in after
    namespace: dict = {}
    exec(after.replace("import logging", ""), namespace)
    assert namespace["ATTENTION_BACKEND_CHOICES"] == ["triton", "torch_native", "superlinear"]


def test_support_triton_is_false_for_superlinear():
    after = patched(COMMON, '''
        def support_triton(backend: str) -> bool:
            return backend not in ["torch_native", "intel_amx"]
    ''')
    namespace: dict = {}
    exec(after, namespace)
    assert namespace["support_triton"]("superlinear") is False
    assert namespace["support_triton"]("triton") is True and namespace["support_triton"]("torch_native") is False
    assert f'if backend == "superlinear": return False  {MARK}' in after


@pytest.mark.parametrize("edit, source, anchor", [
    (REGISTRY, "import logging\nATTENTION_BACKENDS = {}\n", "register_attention_backend"),
    (SERVER_ARGS, "import logging\nCHOICES = []\n", "ATTENTION_BACKEND_CHOICES"),
    (COMMON, "def support_cuda(backend):\n    return True\n", "support_triton"),
])
def test_a_missing_anchor_is_named(edit, source, anchor):
    with pytest.raises(AnchorError, match=anchor):
        patched(edit, source)


# --------------------------------------------------------------------------------------------------
# the real 0.5.9 sources


def source_tree() -> Path:
    return ensure_source_tree("sglang", "0.5.9")


def test_real_sources_find_every_anchor_once_and_compile():
    tree = source_tree()
    for edit in PATCH.files:
        source = (tree / "sglang" / edit.relpath).read_text()
        result = transform_or_raise(PATCH, edit, source, "0.5.9")  # raises on any anchor; compiles
        assert result.anchors and all(anchor.count == 1 for _, anchor in result.anchors), result.anchors
        added = set(result.after.splitlines()) - set(source.splitlines())
        assert added and all(line.endswith(MARK) for line in added), added


def test_real_support_triton_lets_superlinear_through_as_torch_native():
    source = (source_tree() / "sglang" / COMMON.relpath).read_text()
    after = transform_or_raise(PATCH, COMMON, source, "0.5.9").after
    start = after.index("def support_triton(")
    end = after.index("\n\n", start)
    namespace: dict = {}
    exec(after[start:end], namespace)
    assert namespace["support_triton"]("superlinear") is False
    assert namespace["support_triton"]("torch_native") is False and namespace["support_triton"]("triton") is True
