"""radio-layerscale-loader (NeMo-RL) on a snippet in vLLM 0.24-0.33's shape (the real files are
test_conformance.py's). Runs without vLLM.

No behaviour test here: it needs torch and a RADIO checkpoint (a vision encoder of Nemotron-VL
models) loaded by vLLM, which the CPU CI's environment has no model for."""

from __future__ import annotations

import pytest

from toolkit.testing import assert_codemod
from toolkit_catalog.vllm.radio_layerscale_loader.codemods import RadioModelTransformer
from toolkit_catalog.vllm.radio_layerscale_loader.patch import PATCH

RELPATH = "model_executor/models/radio.py"

BEFORE = '''
class RadioModel(nn.Module):
    def load_weights(self, weights) -> set[str]:
        loaded_params: set[str] = set()
        params_dict = dict(self.named_parameters())
        for name, weight in weights_list:
            if sub in {"summary_idxs"}:
                continue
            vllm_key = None
            if sub.startswith("model.blocks."):
                parts = sub.split(".")
                if len(parts) >= 4:
                    layer_idx = parts[2]
                    suffix = ".".join(parts[3:])
                    # Skip layer-scale entries that vLLM doesn't use
                    if suffix in {"ls1", "ls2"} or suffix.startswith(("ls1.", "ls2.")):
                        continue
                    vllm_key = f"model.encoder.layers.{layer_idx}.{suffix}"

            if vllm_key and vllm_key in params_dict:
                loaded_params.add(vllm_key)

        return loaded_params
'''

AFTER = '''
class RadioModel(nn.Module):
    def load_weights(self, weights) -> set[str]:
        loaded_params: set[str] = set()
        params_dict = dict(self.named_parameters())
        for name, weight in weights_list:
            if sub in {"summary_idxs"}:
                continue
            vllm_key = None
            if sub.startswith("model.blocks."):
                parts = sub.split(".")
                if len(parts) >= 4:
                    layer_idx = parts[2]
                    suffix = ".".join(parts[3:])
                    vllm_key = f"model.encoder.layers.{layer_idx}.{suffix}"

            if vllm_key and vllm_key in params_dict:
                loaded_params.add(vllm_key)

        initializer_factor = self.config.initializer_factor  # toolkit:radio-layerscale-loader
        for name, param in params_dict.items():  # toolkit:radio-layerscale-loader
            if name.endswith((".ls1", ".ls2")) and name not in loaded_params:
                param.data.fill_(initializer_factor)
                loaded_params.add(name)
        return loaded_params
'''


def test_layer_scale_loads_and_the_rest_is_initialised_before_the_return():
    # the `summary_idxs` skip is not the layer-scale one: it stays
    assert_codemod(RadioModelTransformer, BEFORE, AFTER, engine_version="0.33.0", relpath=RELPATH,
                   patch_id=PATCH.id)


def test_a_loader_that_loads_layer_scale_already_fails_on_its_anchor():
    fixed = BEFORE.replace('''                    # Skip layer-scale entries that vLLM doesn't use
                    if suffix in {"ls1", "ls2"} or suffix.startswith(("ls1.", "ls2.")):
                        continue
''', "")
    with pytest.raises(AssertionError, match="skip"):
        assert_codemod(RadioModelTransformer, fixed, fixed, relpath=RELPATH, patch_id=PATCH.id)
