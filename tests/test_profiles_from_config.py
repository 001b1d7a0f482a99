"""`tiertp profile compose`: a TP profile for a model the shipped tables do
not cover, composed from its config.json the way the shipped ones are."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tiertp import _scheduler
from tiertp.cli import main as cli_main
from tiertp.data import data_dir
from tiertp.profiles import resolve
from tiertp.profiles.models import MODELS, get_model

# Llama-3.1-8B-Instruct's config.json, as published (the fields that matter).
LLAMA_8B = {
    "_name_or_path": "meta-llama/Llama-3.1-8B-Instruct",
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "vocab_size": 128256,
}
# Qwen2.5-7B-Instruct's: 28 query heads and 4 KV heads split over 1, 2 and
# 4 GPUs only; q/k/v carry biases.
QWEN_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
    "vocab_size": 152064,
}


def compose(tmp_path: Path, config: dict | str | Path, *extra: str, gpu: str = "h100") -> tuple[int, Path]:
    """Runs `tiertp profile compose`; `config` is written to a config.json
    unless it is a path already."""
    if isinstance(config, Path):
        path = config
    else:
        path = tmp_path / "config.json"
        path.write_text(config if isinstance(config, str) else json.dumps(config))
    out = tmp_path / "profile.json"
    rc = cli_main(["profile", "compose", "--config", str(path), "--gpu", gpu, "--out", str(out),
                   "--data", str(data_dir()), *extra])
    return rc, out


def test_a_shipped_models_config_composes_its_shipped_table(tmp_path):
    shipped = json.loads(resolve("h100", "llama-3.1-8b").read_text())
    date = shipped["provenance"]["generated"]
    rc, out = compose(tmp_path, LLAMA_8B, "--name", "llama-3.1-8b", "--date", date)
    assert rc == 0
    composed = json.loads(out.read_text())
    # Only the command that wrote it differs.
    assert "tiertp profile compose" in composed["provenance"].pop("generator")
    assert "tiertp profile build-defaults" in shipped["provenance"].pop("generator")
    assert composed == shipped


def test_a_model_directory_composes_at_the_levels_its_heads_split(tmp_path):
    model_dir = tmp_path / "Qwen2.5-7B-Instruct"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(QWEN_7B))
    rc, out = compose(tmp_path, model_dir)
    assert rc == 0
    profile = json.loads(out.read_text())
    assert profile["model"] == "qwen2.5-7b-instruct", "named after the folder when the config names nothing"
    assert list(profile["tp_levels"]) == ["1", "2", "4"]
    assert profile["provenance"]["tp_levels_left_out"] == {"8": "heads do not split evenly"}
    assert profile["provenance"]["model_shape"]["qkv_bias"] is True
    loaded = _scheduler.Profile.load(str(out))
    assert loaded.tp_levels == [1, 2, 4]


def test_tied_embeddings_count_once_and_leave_more_kv_room(tmp_path):
    (tmp_path / "untied").mkdir()
    (tmp_path / "tied").mkdir()
    untied_rc, untied = compose(tmp_path / "untied", LLAMA_8B)
    tied_rc, tied = compose(tmp_path / "tied", {**LLAMA_8B, "tie_word_embeddings": True})
    assert untied_rc == tied_rc == 0
    a, b = json.loads(untied.read_text()), json.loads(tied.read_text())
    vocab_rows = LLAMA_8B["vocab_size"] * LLAMA_8B["hidden_size"]
    assert a["provenance"]["model_shape"]["params"] - b["provenance"]["model_shape"]["params"] == vocab_rows
    assert b["tp_levels"]["1"]["kv_capacity_tokens"] > a["tp_levels"]["1"]["kv_capacity_tokens"]


@pytest.mark.parametrize(
    "config, problem",
    [
        ({**LLAMA_8B, "architectures": ["GemmaForCausalLM"]}, r"architectures \['GemmaForCausalLM'\] not supported; supported: LlamaForCausalLM"),
        ({**LLAMA_8B, "head_dim": 96}, r"head_dim 96; the kernel tables measure only 128"),
        ({k: v for k, v in LLAMA_8B.items() if k != "hidden_size"}, r"config has no 'hidden_size'"),
        ({**LLAMA_8B, "hidden_act": "gelu"}, r"hidden_act 'gelu'"),
        ({**LLAMA_8B, "num_attention_heads": "many"}, r"not a number"),
        ('{"architectures": ["LlamaForCausalLM"', r"not valid JSON"),
        ("[1, 2]", r"holds a JSON object"),
    ],
)
def test_a_config_it_cannot_compose_is_named_with_the_problem(tmp_path, capsys, config, problem):
    rc, out = compose(tmp_path, config)
    assert rc == 2
    assert not out.exists()
    err = capsys.readouterr().err
    assert "config.json" in err
    assert re.search(problem, err), err


def test_a_missing_config_is_named(tmp_path, capsys):
    rc, _ = compose(tmp_path, tmp_path / "nowhere")
    assert rc == 2
    assert "nowhere: no such file" in capsys.readouterr().err


def test_an_unknown_model_name_points_to_compose():
    assert "mistral-7b" not in MODELS
    with pytest.raises(ValueError, match=r"tiertp profile compose --config"):
        get_model("mistral-7b")


def test_replay_runs_on_a_composed_profile(tmp_path):
    rc, profile = compose(tmp_path, QWEN_7B, "--name", "qwen2.5-7b")
    assert rc == 0
    out = tmp_path / "replay"
    rc = cli_main([
        "replay", "--trace", "synthetic:poisson,rate=4,duration=20", "--tier-fractions", "chat=0.5,agent=0.5",
            "--profile", str(profile), "--gpus", "4",
        "--policies", "tiertp", "--rps", "4", "--duration", "20", "--no-plots", "--no-progress", "--out", str(out),
    ])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert report["loads"][0]["policies"]["tiertp"]["goodput_rps"] > 0
