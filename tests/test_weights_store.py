"""The store built from a checkpoint: every rank's view of every parameter equals
SGLang's shard of it (after the per-block split), levels and models it cannot
serve are rejected with a reason. No SGLang, no subprocess."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch
from safetensors.torch import save_file
from weights_fixtures import skeleton

from tiertp.weights import (BindError, NoGPUError, StoreHandle, UnsupportedLevel, UnsupportedModel, WeightStoreError,
                            attach, bind, create_store)
from tiertp.weights.interleave import deinterleave, split_blocks
from tiertp.weights.layout import padded_vocab
from tiertp.weights.shm_backing import SHM_DIR, sweep_stale


def write_llama(path, *, heads=8, kv_heads=4, head_dim=4, hidden=16, inter=24, layers=2, vocab=100,
                tied=False, bias=False, arch="LlamaForCausalLM"):
    """A random HF-style Llama checkpoint (config.json + model.safetensors) in `path`."""
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    t = {"model.embed_tokens.weight": r(vocab, hidden), "model.norm.weight": r(hidden)}
    for i in range(layers):
        p = f"model.layers.{i}"
        t[f"{p}.self_attn.q_proj.weight"] = r(heads * head_dim, hidden)
        t[f"{p}.self_attn.k_proj.weight"] = r(kv_heads * head_dim, hidden)
        t[f"{p}.self_attn.v_proj.weight"] = r(kv_heads * head_dim, hidden)
        t[f"{p}.self_attn.o_proj.weight"] = r(hidden, heads * head_dim)
        if bias:
            for x, n in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
                t[f"{p}.self_attn.{x}_proj.bias"] = r(n * head_dim)
            t[f"{p}.self_attn.o_proj.bias"] = r(hidden)
        t[f"{p}.mlp.gate_proj.weight"] = r(inter, hidden)
        t[f"{p}.mlp.up_proj.weight"] = r(inter, hidden)
        t[f"{p}.mlp.down_proj.weight"] = r(hidden, inter)
        t[f"{p}.input_layernorm.weight"] = r(hidden)
        t[f"{p}.post_attention_layernorm.weight"] = r(hidden)
    if not tied:
        t["lm_head.weight"] = r(vocab, hidden)
    os.makedirs(path, exist_ok=True)
    save_file(t, os.path.join(path, "model.safetensors"))
    cfg = {"architectures": [arch], "num_attention_heads": heads, "num_key_value_heads": kv_heads,
           "head_dim": head_dim, "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
           "vocab_size": vocab, "tie_word_embeddings": tied, "attention_bias": bias, "torch_dtype": "float32"}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    return t


def _sglang_shard(t, name, tp, rank, vocab):
    """What SGLang's weight loaders put in rank `rank`'s parameter `name` at TP `tp`."""
    def chunk(x, dim=0):
        return x.chunk(tp, dim=dim)[rank]

    if ".qkv_proj." in name:
        return torch.cat([chunk(t[name.replace("qkv_proj", f"{x}_proj")]) for x in "qkv"])
    if ".gate_up_proj." in name:
        return torch.cat([chunk(t[name.replace("gate_up_proj", f"{x}_proj")]) for x in ("gate", "up")])
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        return chunk(t[name], dim=1)
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        table = t[name]
        padded = torch.cat([table, table.new_zeros(padded_vocab(vocab, tp) - vocab, table.shape[1])])
        return chunk(padded)
    return t[name]


@pytest.mark.parametrize("levels,heads,kv_heads,bias,tied", [
    ((1, 2, 4), 8, 4, False, False),
    ((1, 2, 4), 8, 8, True, True),
    ((1, 3), 9, 3, False, True),
])
def test_every_shard_equals_sglang_shard(tmp_path, levels, heads, kv_heads, bias, tied):
    t = write_llama(tmp_path, heads=heads, kv_heads=kv_heads, bias=bias, tied=tied)
    with create_store(tmp_path, levels) as store:
        handle = StoreHandle.decode(store.handle.encode())
        attached = attach(handle)
        layout = attached.layout
        assert ("lm_head.weight" in layout.names()) == (not tied)
        for tp in levels:
            for rank in range(tp):
                for e in layout.entries:
                    view = attached.shard(e.name, tp, rank)
                    assert attached.contains(view), e.name
                    assert view.untyped_storage().data_ptr() == attached.base.untyped_storage().data_ptr()
                    if e.block_parts:
                        blocks = layout.blocks // tp
                        if view.dim() == 2:
                            view = deinterleave(view.t(), e.block_parts, blocks).t()
                        else:
                            view = torch.cat(split_blocks(view, e.block_parts, blocks))
                    assert torch.equal(view, _sglang_shard(t, e.name, tp, rank, 100)), (e.name, tp, rank)


def test_vocab_padding_per_level(tmp_path):
    write_llama(tmp_path, heads=9, kv_heads=3, vocab=100)
    with create_store(tmp_path, (1, 3)) as store:
        assert padded_vocab(100, 1) == 128 and padded_vocab(100, 3) == 192  # SGLang pads 64 * tp when needed
        table = store.full("model.embed_tokens.weight")
        assert table.shape[0] == 192 and not table[100:].any()
        assert store.shard("model.embed_tokens.weight", 3, 2).shape == (64, 16)
        assert store.shard("model.embed_tokens.weight", 1, 0).shape == (128, 16)


def test_levels_and_models_the_store_cannot_serve(tmp_path):
    write_llama(tmp_path / "m", heads=8, kv_heads=2)
    with pytest.raises(UnsupportedLevel, match=r"TP level\(s\) \[4\] exceed the 2 KV heads"):
        create_store(tmp_path / "m", (1, 2, 4))
    with create_store(tmp_path / "m", (1, 2)) as store:
        with pytest.raises(UnsupportedLevel, match="TP 4 is not a level this weight store was built for"):
            store.shard("model.norm.weight", 4, 0)
        with pytest.raises(UnsupportedLevel, match="rank 2 outside TP 2"):
            store.shard("model.norm.weight", 2, 2)
    write_llama(tmp_path / "q", arch="Qwen2ForCausalLM")
    with pytest.raises(UnsupportedModel, match="Qwen2ForCausalLM.*supported: LlamaForCausalLM"):
        create_store(tmp_path / "q", (1, 2))
    write_llama(tmp_path / "odd", heads=6, kv_heads=6)
    with pytest.raises(UnsupportedLevel, match="6 attention heads cannot be split into 4 blocks"):
        create_store(tmp_path / "odd", (1, 4))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a host without a GPU")
def test_cuda_store_without_gpu_is_a_clear_error(tmp_path):
    write_llama(tmp_path)
    with pytest.raises(NoGPUError, match="no GPU"):
        create_store(tmp_path, (1, 2), device="cuda:0")


def test_bind_replaces_every_parameter_and_checks_the_model(tmp_path):
    write_llama(tmp_path)
    with create_store(tmp_path, (1, 2, 4)) as store:
        model = skeleton(store, 2, 1)
        model.model.norm.weight.weight_loader = "kept"  # attributes SGLang sets survive the bind
        stats = bind(model, store, 2, 1)
        assert stats.parameters == len(store.layout.entries)
        assert all(store.contains(p) for p in model.parameters())
        assert model.model.norm.weight.weight_loader == "kept"
        with pytest.raises(UnsupportedLevel, match="TP 3 is not a level"):
            bind(skeleton(store, 1, 0), store, 3, 0)
        with pytest.raises(BindError, match=r"expects shape .* at TP 4"):
            bind(skeleton(store, 2, 0), store, 4, 0)
        with pytest.raises(BindError, match="dtype"):
            bind(skeleton(store, 2, 0, dtype=torch.float64), store, 2, 0)
        extra = skeleton(store, 2, 0)
        extra.register_parameter("stray", torch.nn.Parameter(torch.zeros(1)))
        with pytest.raises(BindError, match="no tensor in the weight store.*stray"):
            bind(extra, store, 2, 0)


def test_store_files_of_dead_owners_are_swept(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = SHM_DIR / f"tiertp-weights-{dead.pid}-{'0' * 32}"
    stale.write_bytes(b"x")
    write_llama(tmp_path)
    with create_store(tmp_path, (1, 2)) as store:  # creating a store sweeps
        assert not stale.exists()
        assert sweep_stale() == []  # our own, live store is kept
        path = store.handle.backing.path
        assert os.path.exists(path)
    assert not os.path.exists(path)  # close() unlinks
    with pytest.raises(WeightStoreError, match="is gone"):
        attach(store.handle)
