"""Model shapes the default tables are composed for: the one list of them,
and the shape of any other composable model read from its `config.json`.

Shapes are from each model's Hugging Face `config.json`. Only the
architecture matters here (Llama/Mistral/Qwen2 decoder: GQA attention with
RoPE, SwiGLU MLP, RMSNorm), so one shape can stand for several checkpoints
(`aliases`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

BYTES_PER_PARAM = 2  # bf16 weights and KV cache

# Architectures whose decoder layer is the one `compose` adds up (GQA
# attention with RoPE, SwiGLU MLP, RMSNorm), each with whether its q/k/v
# projections carry biases (None: as the config's `attention_bias` says).
COMPOSABLE_ARCHITECTURES: dict[str, bool | None] = {
    "LlamaForCausalLM": None,
    "MistralForCausalLM": False,
    "Qwen2ForCausalLM": True,
}


@dataclass(frozen=True, kw_only=True)
class DecoderShape:
    """A decoder-only transformer, as far as its kernel shapes go: the one
    definition of those fields, shared by `ModelShape` (the default tables'
    models) and tiertp.weights.llama_plan.LlamaShape (a checkpoint's storage plan).

    head_dim * heads need not equal hidden.
    """

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @staticmethod
    def fields_from_config(cfg: dict) -> dict[str, int]:
        """These fields from a Hugging Face ``config.json`` (as a dict).

        kv_heads defaults to heads (no GQA) and head_dim to hidden / heads,
        as transformers does when the config leaves them out.
        """
        heads = int(cfg["num_attention_heads"])
        return {
            "layers": int(cfg["num_hidden_layers"]),
            "hidden": int(cfg["hidden_size"]),
            "heads": heads,
            "kv_heads": int(cfg.get("num_key_value_heads") or heads),
            "head_dim": int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
            "intermediate": int(cfg["intermediate_size"]),
            "vocab": int(cfg["vocab_size"]),
        }

    @staticmethod
    def config_problem(cfg: dict, architectures: Iterable[str]) -> str | None:
        """Why a Hugging Face ``config.json`` (as a dict) is not a decoder of
        one of `architectures` with this decoder's MLP (SwiGLU with SiLU, no
        biases), or None."""
        archs = cfg.get("architectures") or []
        if len(archs) != 1 or archs[0] not in architectures:
            return f"architectures {archs} not supported; supported: {', '.join(architectures)}"
        if cfg.get("hidden_act", "silu") != "silu":
            return f"hidden_act {cfg['hidden_act']!r}: the MLP supported is SwiGLU with silu"
        if cfg.get("mlp_bias"):
            return "mlp_bias=true: the MLP supported has no biases"
        return None

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def tp_ok(self, tp: int) -> bool:
        """Attention heads and KV heads split evenly over `tp` GPUs."""
        return self.heads % tp == 0 and self.kv_heads % tp == 0


@dataclass(frozen=True, kw_only=True)
class ModelShape(DecoderShape):
    """A named model whose TP tables are composed (Llama/Mistral/Qwen2 decoder).

    Invariant: heads and kv_heads divide evenly at every TP level used
    (checked by `tp_ok`).
    """

    name: str
    hf_id: str
    qkv_bias: bool = False
    # The LM head reuses the embedding's weights (small models do): they
    # count once in the weights' memory, and the LM head GEMM is the same.
    tied_embeddings: bool = False
    aliases: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, cfg: dict, *, name: str, hf_id: str) -> ModelShape:
        """The shape a Hugging Face ``config.json`` (as a dict) describes;
        ValueError naming the problem when its layers are not the ones
        `compose` adds up."""
        problem = cls.config_problem(cfg, COMPOSABLE_ARCHITECTURES)
        if problem:
            raise ValueError(f"{problem} (composing a profile)")
        try:
            fields = cls.fields_from_config(cfg)
        except KeyError as e:
            raise ValueError(f"config has no {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ValueError(f"config has a field that is not a number: {e}") from None
        if min(fields.values()) < 1:
            raise ValueError(f"config has a size below 1: {fields}")
        bias = COMPOSABLE_ARCHITECTURES[cfg["architectures"][0]]
        return cls(
            **fields,
            name=name,
            hf_id=hf_id,
            qkv_bias=bool(cfg.get("attention_bias", False)) if bias is None else bias,
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        )

    @property
    def params(self) -> int:
        """Parameter count (the embedding and LM head twice unless tied)."""
        h = self.hidden
        per_layer = (
            h * (self.q_dim + 2 * self.kv_dim)  # fused QKV
            + (self.q_dim + 2 * self.kv_dim if self.qkv_bias else 0)
            + self.q_dim * h  # O
            + 3 * h * self.intermediate  # gate, up, down
            + 2 * h  # two RMSNorms
        )
        embeddings = 1 if self.tied_embeddings else 2
        return self.layers * per_layer + embeddings * self.vocab * h + h

    @property
    def weight_bytes(self) -> int:
        return self.params * BYTES_PER_PARAM

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes per token: all layers, all KV heads, K and V."""
        return self.layers * 2 * self.kv_dim * BYTES_PER_PARAM

    def describe(self) -> dict[str, object]:
        """The shape as recorded in a profile's provenance."""
        return {
            "hf_id": self.hf_id,
            "layers": self.layers,
            "hidden": self.hidden,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "intermediate": self.intermediate,
            "vocab": self.vocab,
            "qkv_bias": self.qkv_bias,
            "tied_embeddings": self.tied_embeddings,
            "params": self.params,
        }


MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in [
        ModelShape(
            name="llama-3.1-8b",
            hf_id="meta-llama/Llama-3.1-8B-Instruct",
            layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
            intermediate=14336, vocab=128256,
        ),
        ModelShape(
            name="qwen2.5-14b",
            hf_id="Qwen/Qwen2.5-14B-Instruct",
            layers=48, hidden=5120, heads=40, kv_heads=8, head_dim=128,
            intermediate=13824, vocab=152064, qkv_bias=True,
            aliases=("deepseek-r1-distill-qwen-14b",),
        ),
        ModelShape(
            name="llama-3.1-70b",
            hf_id="meta-llama/Llama-3.1-70B-Instruct",
            layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
            intermediate=28672, vocab=128256,
        ),
    ]
}


def get_model(name: str) -> ModelShape:
    """The shape named `name` (case-insensitive; aliases accepted)."""
    key = name.strip().lower()
    for m in MODELS.values():
        if key == m.name or key in m.aliases:
            return m
    valid = sorted([*MODELS, *(a for m in MODELS.values() for a in m.aliases)])
    raise ValueError(
        f"unknown model {name!r}; valid models: {', '.join(valid)} "
        "(for another Llama-, Mistral- or Qwen2-shaped model, compose a profile from its config.json: "
        "`tiertp profile compose --config PATH --gpu GPU --out FILE`, then pass `--profile FILE`)"
    )
