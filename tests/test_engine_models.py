"""tiertp.engine.models and sglang_compat without starting an engine."""

from __future__ import annotations

import json

import pytest

from tiertp.engine import models, sglang_compat
from tiertp.engine.models import EMBEDDED_MODELS, ModelError, resolve_model


def test_unknown_name_lists_embedded_models():
    with pytest.raises(ModelError) as e:
        resolve_model("no-such-model")
    for name in EMBEDDED_MODELS:
        assert name in str(e.value)


def test_missing_dir_is_named(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model(str(missing))


def test_incomplete_dir_names_what_is_missing(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ModelError) as e:
        resolve_model(str(tmp_path))
    assert "*.safetensors" in str(e.value) and "tokenizer" in str(e.value)
    assert "config.json" not in str(e.value).split("missing", 1)[1]


def test_config_without_architectures_is_rejected(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ModelError, match="architectures"):
        resolve_model(str(tmp_path))


def test_valid_dir_resolves(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "tokenizer.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == tmp_path.resolve()


@pytest.mark.parametrize("name", ["tiny-llama", "small-llama"])
def test_random_llamas_are_built_once_and_shard_at_tp_1_2_4(name):
    path = resolve_model(name)
    assert (path / ".complete").is_file()
    assert resolve_model(name) == path  # cached, not rebuilt
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    for tp in (1, 2, 4):
        assert cfg["num_attention_heads"] % tp == 0 and cfg["num_key_value_heads"] % tp == 0


def test_small_llama_is_the_wider_deeper_random_llama():
    tiny, small = (json.loads((resolve_model(n) / "config.json").read_text()) for n in ("tiny-llama", "small-llama"))
    assert (small["hidden_size"], small["num_hidden_layers"]) == (768, 4)
    assert (tiny["hidden_size"], tiny["num_hidden_layers"]) == (256, 2)
    assert small["vocab_size"] == tiny["vocab_size"]  # one tokenizer: SmolLM2's


def test_cache_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TIERTP_CACHE", str(tmp_path))
    assert models.cache_dir() == tmp_path / "models"


def test_threads_bind_one_group_per_rank():
    assert sglang_compat.cpu_threads_bind(1, [0, 1]) == "0,1"
    assert sglang_compat.cpu_threads_bind(2, [0, 1]) == "0|1"
    # more ranks than cores: shared round-robin (oversubscribed)
    assert sglang_compat.cpu_threads_bind(3, [0, 1]) == "0|1|0"
    # one core per rank (a core standing in for a device)
    assert sglang_compat.cpu_threads_bind(1, [0, 1], cores_per_rank=1) == "0"
    assert sglang_compat.cpu_threads_bind(2, [0, 1, 2, 3], cores_per_rank=2) == "0,1|2,3"
    # pinned by device: the TP1 instance of device 1 and rank 1 of a TP2 group use device 1's cores
    assert sglang_compat.cpu_threads_bind(1, [0, 1], cores_per_rank=1, devices=(1,)) == "1"
    assert sglang_compat.cpu_threads_bind(2, [0, 1, 2, 3], cores_per_rank=2, devices=(2, 3)) == "0,1|2,3"
    assert sglang_compat.cpu_threads_bind(1, [0, 1, 2, 3], cores_per_rank=2, devices=(1,)) == "2,3"
    with pytest.raises(ValueError):
        sglang_compat.cpu_threads_bind(0, [0, 1])


def test_unknown_device_is_rejected():
    with pytest.raises(ValueError, match="cpu, cuda"):
        sglang_compat.engine_kwargs("tpu", 1)


def test_sgl_kernel_stand_in_raises_when_called():
    import importlib.util

    spec = importlib.util.spec_from_file_location("_stub", sglang_compat.STUB_DIR / "sgl_kernel" / "__init__.py")
    stub = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stub)
    for name in stub.STUB_NAMES:
        with pytest.raises(stub.SglKernelStubError, match=name):
            getattr(stub, name)()


def test_generation_config_carries_sampling_and_token_ids(tmp_path):
    models._write_generation_config(tmp_path, {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None},
                                    models.SMOLLM2_SAMPLING)
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert gen == {"bos_token_id": 1, "eos_token_id": 2, "do_sample": True, "temperature": 0.2, "top_p": 0.9}


def test_smollm2_recommends_its_model_cards_sampling():
    # Built (and cached) anyway by the tiny-llama test above, whose tokenizer it is.
    path = resolve_model("smollm2-135m")
    gen = json.loads((path / "generation_config.json").read_text())
    assert (gen["do_sample"], gen["temperature"], gen["top_p"]) == (True, 0.2, 0.9)
    cfg = json.loads((path / "config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"]) == (cfg["bos_token_id"], cfg["eos_token_id"])
    assert not (resolve_model("tiny-llama") / "generation_config.json").exists()
