"""The engine-start check's path as vLLM's ``vllm.general_plugins`` entry point names it
(``toolkit.start_check:vllm_plugin``, pyproject.toml): the check lives in :mod:`toolkit.cluster.expected_patches`."""

from toolkit.cluster.expected_patches import (EXPECT_PATCHES, RAY_COPY, UnpatchedEngine, check_expected_patches,
                                         engine_start_env, expected_patches, vllm_plugin)

__all__ = ["EXPECT_PATCHES", "RAY_COPY", "UnpatchedEngine", "check_expected_patches", "engine_start_env",
           "expected_patches", "vllm_plugin"]
