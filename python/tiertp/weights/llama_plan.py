"""The storage plan of a Llama-family checkpoint: which SGLang parameter each
stored tensor backs, how it is sharded, and how it is built from the HF tensors.

Names follow SGLang's LlamaForCausalLM (q/k/v fused into ``qkv_proj``,
gate/up into ``gate_up_proj``; with tied embeddings there is no
``lm_head.weight``, SGLang's lm_head *is* embed_tokens).

KV heads: SGLang replicates KV heads when TP > num_key_value_heads (rank r
holds head r*H//k). A zero-copy shard cannot serve that: the replicated
level needs one copy per rank where the lower levels need one in all, so
such levels are rejected (UnsupportedLevel) instead of laid out wrongly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tiertp.profiles.models import DecoderShape
from tiertp.weights.checkpoint import Checkpoint
from tiertp.weights.errors import UnsupportedLevel, UnsupportedModel
from tiertp.weights.interleave import block_count, interleave
from tiertp.weights.layout import FUSED_COLUMN, REPLICATED, ROW_TRANSPOSED, VOCAB_ROWS, Entry, padded_vocab

# The one list of architectures the store can lay out (and tiertp.weights.sglang_llama can run).
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)
# Checkpoint tensors that SGLang itself skips when loading a Llama.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


@dataclass(frozen=True, kw_only=True)
class LlamaShape(DecoderShape):
    """A Llama checkpoint's shape: the decoder's, plus what its storage plan depends on."""

    tied: bool  # no lm_head.weight: SGLang's lm_head is embed_tokens
    attention_bias: bool  # q/k/v and o_proj biases

    @classmethod
    def from_config(cls, cfg: dict) -> LlamaShape:
        problem = cls.config_problem(cfg, SUPPORTED_ARCHITECTURES)
        if problem:
            raise UnsupportedModel(f"{problem} (the shared weight store)")
        if cfg.get("quantization_config"):
            raise UnsupportedModel("quantized checkpoints are not supported by the shared weight store")
        return cls(
            **cls.fields_from_config(cfg),
            tied=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", False) or cfg.get("bias", False)),
        )

    def check_levels(self, levels, blocks: int) -> None:
        over = [k for k in levels if k > self.kv_heads]
        if over:
            raise UnsupportedLevel(
                f"TP level(s) {over} exceed the {self.kv_heads} KV heads: SGLang would replicate KV heads "
                "there, which a zero-copy shard of the shared store cannot hold; use levels <= "
                f"{self.kv_heads}"
            )
        for what, n in (("attention heads", self.heads), ("KV heads", self.kv_heads),
                        ("intermediate rows", self.intermediate)):
            if n % blocks:
                raise UnsupportedLevel(
                    f"{n} {what} cannot be split into {blocks} blocks (the least common multiple of "
                    f"TP levels {sorted(levels)})"
                )


Build = Callable[[Checkpoint], torch.Tensor]


@dataclass(frozen=True)
class Planned:
    entry: Entry
    build: Build  # the stored tensor (storage order), from the checkpoint
    sources: tuple[str, ...]  # checkpoint tensors it reads


def plan(cfg: dict, levels) -> tuple[str, int, list[Planned]]:
    """(architecture, blocks B, planned entries) for a Llama config and candidate TP levels."""
    shape = LlamaShape.from_config(cfg)
    blocks = block_count(levels)
    shape.check_levels(levels, blocks)
    q_rows, kv_rows = shape.q_dim, shape.kv_dim
    qkv_parts = (q_rows // blocks, kv_rows // blocks, kv_rows // blocks)
    gate_up_parts = (shape.intermediate // blocks,) * 2
    h = shape.hidden
    out: list[Planned] = []

    def copy(name: str, src: str, shp: tuple[int, ...]) -> None:
        out.append(Planned(Entry(name, REPLICATED, shp), lambda ck: ck.get(src), (src,)))

    def fused(name: str, srcs: tuple[str, ...], parts: tuple[int, ...], cols: tuple[int, ...]) -> None:
        out.append(Planned(Entry(name, FUSED_COLUMN, (blocks * sum(parts), *cols), block_parts=parts),
                           lambda ck: interleave([ck.get(s) for s in srcs], blocks), srcs))

    def transposed(name: str, src: str, in_features: int) -> None:
        out.append(Planned(Entry(name, ROW_TRANSPOSED, (in_features, h)), lambda ck: ck.get(src).t(), (src,)))

    vocab_rows = tuple((k, padded_vocab(shape.vocab, k)) for k in sorted(set(levels)))
    rows = max(r for _, r in vocab_rows)

    def vocab(name: str, src: str) -> None:
        def build(ck: Checkpoint) -> torch.Tensor:
            table = ck.get(src)
            if table.shape[0] != shape.vocab:
                raise UnsupportedModel(f"{src} has {table.shape[0]} rows, the config's vocab_size is {shape.vocab}")
            return torch.cat([table, table.new_zeros(rows - table.shape[0], *table.shape[1:])])

        out.append(Planned(Entry(name, VOCAB_ROWS, (rows, h), vocab_rows=vocab_rows), build, (src,)))

    vocab("model.embed_tokens.weight", "model.embed_tokens.weight")
    for i in range(shape.layers):
        p = f"model.layers.{i}"
        attn = f"{p}.self_attn"
        fused(f"{attn}.qkv_proj.weight", tuple(f"{attn}.{x}_proj.weight" for x in "qkv"), qkv_parts, (h,))
        if shape.attention_bias:
            fused(f"{attn}.qkv_proj.bias", tuple(f"{attn}.{x}_proj.bias" for x in "qkv"), qkv_parts, ())
            copy(f"{attn}.o_proj.bias", f"{attn}.o_proj.bias", (h,))  # row-parallel bias: not sharded
        transposed(f"{attn}.o_proj.weight", f"{attn}.o_proj.weight", q_rows)
        fused(f"{p}.mlp.gate_up_proj.weight", (f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight"),
              gate_up_parts, (h,))
        transposed(f"{p}.mlp.down_proj.weight", f"{p}.mlp.down_proj.weight", shape.intermediate)
        copy(f"{p}.input_layernorm.weight", f"{p}.input_layernorm.weight", (h,))
        copy(f"{p}.post_attention_layernorm.weight", f"{p}.post_attention_layernorm.weight", (h,))
    copy("model.norm.weight", "model.norm.weight", (h,))
    if not shape.tied:
        vocab("lm_head.weight", "lm_head.weight")
    return SUPPORTED_ARCHITECTURES[0], blocks, out


def check_sources(planned: list[Planned], ck: Checkpoint) -> None:
    """Fail unless the checkpoint holds exactly the tensors the plan reads (bar ones SGLang skips too)."""
    wanted = {s for p in planned for s in p.sources}
    have = ck.names()
    missing = sorted(wanted - have)
    if missing:
        raise UnsupportedModel(f"{ck.model_dir}: checkpoint lacks {len(missing)} tensor(s), e.g. {missing[:3]}")
    # A tied checkpoint may still carry lm_head.weight; SGLang ignores it then, as we do.
    extra = sorted(n for n in have - wanted if not n.endswith(_IGNORED_SUFFIXES) and n != "lm_head.weight")
    if extra:
        raise UnsupportedModel(f"{ck.model_dir}: checkpoint has tensors the store would drop, e.g. {extra[:3]}")
