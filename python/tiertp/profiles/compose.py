"""Step time of one forward pass at one TP level, composed from kernels.

A step runs `layers` identical decoder layers plus once-per-step work. On
each GPU of a TP group of size `tp`, one layer is:
- GEMMs at TP-sharded shapes (m = tokens in the step, [m x k] @ [k x n]):
  QKV (column-parallel, n = (q_dim + 2 kv_dim) / tp, k = hidden),
  O (row-parallel, n = hidden, k = q_dim / tp),
  gate/up (column-parallel, fused, n = 2 intermediate / tp, k = hidden),
  down (row-parallel, n = hidden, k = intermediate / tp);
- attention over heads/tp query heads and kv_heads/tp KV heads: context
  attention for prefill, generation attention for decode;
- two all-reduces of m x hidden (after O and after down) when tp > 1;
- memory-bound elementwise kernels (two fused add+RMSNorm, RoPE, KV-cache
  store, SiLU-and-mul) at the measured HBM streaming rate, each no faster
  than the measured kernel floor.

Once per step: the vocab-parallel embedding (lookup, plus an all-reduce
when tp > 1), the final RMSNorm, the LM head GEMM for the tokens that need
logits (the last token of each sequence, n = vocab / tp), the all-gather of
the logits when tp > 1, and `SCHEDULER_OVERHEAD_MS`.

Prefill assumes a batch of `batch_size` prompts of equal length
batch_tokens / batch_size with no cached prefix; decode assumes every
sequence has `context_len` tokens in its KV cache (the new one included).
Prefill all-reduces use the eager measurements, decode ones the CUDA-graph
measurements (how SGLang runs each).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tiertp.profiles.kernels import HEAD_DIM, KernelTables
from tiertp.profiles.models import BYTES_PER_PARAM, ModelShape

# CPU-side work per step that the GPU kernels do not show: SGLang's overlap
# scheduler hides batch assembly behind the previous step, so what is left is
# sampling, output processing and launch gaps. One constant for prefill and
# decode, every GPU and TP level: a documented estimate, not a measurement.
SCHEDULER_OVERHEAD_MS = 0.5


@dataclass(frozen=True)
class Elementwise:
    """Memory-bound kernels: max(floor_ms, bytes / bandwidth) each.

    bandwidth: bytes per ms streamed from HBM; floor_ms: the shortest a
    kernel takes. `from_kernels` reads both off the GEMM table.
    """

    bandwidth: float
    floor_ms: float

    @classmethod
    def from_kernels(cls, kernels: KernelTables) -> Elementwise:
        return cls(bandwidth=kernels.stream_bandwidth(), floor_ms=kernels.kernel_floor_ms())

    def time(self, *kernel_bytes: float) -> float:
        return sum(max(self.floor_ms, b / self.bandwidth) for b in kernel_bytes)


@dataclass
class StepTime:
    """One step's time (ms) by component: `layer` once per layer (times
    `layers`), `step` once per step."""

    layers: int
    layer: dict[str, float] = field(default_factory=dict)
    step: dict[str, float] = field(default_factory=dict)

    @property
    def layer_ms(self) -> float:
        return sum(self.layer.values())

    @property
    def total_ms(self) -> float:
        return self.layers * self.layer_ms + sum(self.step.values())


class Composer:
    """Step times of `model` at TP `tp` on the GPU `kernels` were measured on."""

    def __init__(
        self,
        model: ModelShape,
        kernels: KernelTables,
        tp: int,
        *,
        overhead_ms: float = SCHEDULER_OVERHEAD_MS,
        elementwise: Elementwise | None = None,
    ) -> None:
        if tp < 1 or not model.tp_ok(tp):
            raise ValueError(
                f"{model.name}: TP {tp} does not split {model.heads} heads / {model.kv_heads} KV heads evenly"
            )
        if model.head_dim != HEAD_DIM:
            raise ValueError(f"{model.name}: head_dim {model.head_dim}; the kernel tables measure only {HEAD_DIM}")
        self.model = model
        self.kernels = kernels
        self.tp = tp
        self.overhead_ms = overhead_ms
        self.elementwise = elementwise or Elementwise.from_kernels(kernels)

    def prefill(self, batch_tokens: float, batch_size: float) -> StepTime:
        """`batch_size` prompts totalling `batch_tokens` tokens (a batch
        size above the token count is read as one token per prompt)."""
        m = self.model
        batch = min(batch_size, batch_tokens)
        attn = self.kernels.context_attention(batch, batch_tokens / batch, m.heads // self.tp, m.kv_heads // self.tp)
        return self._step(batch_tokens, batch, attn, graph=False)

    def decode(self, batch_size: float, context_len: float) -> StepTime:
        """One new token for each of `batch_size` sequences of `context_len`."""
        m = self.model
        attn = self.kernels.generation_attention(batch_size, context_len, m.heads // self.tp, m.kv_heads // self.tp)
        return self._step(batch_size, batch_size, attn, graph=True)

    def _step(self, tokens: float, logits: float, attention_ms: float, graph: bool) -> StepTime:
        m, k, tp = self.model, self.kernels, self.tp
        h, b = m.hidden, BYTES_PER_PARAM
        out = StepTime(layers=m.layers)
        out.layer = {
            "gemm_qkv": k.gemm(tokens, (m.q_dim + 2 * m.kv_dim) // tp, h),
            "attention": attention_ms,
            "gemm_o": k.gemm(tokens, h, m.q_dim // tp),
            "gemm_gate_up": k.gemm(tokens, 2 * m.intermediate // tp, h),
            "gemm_down": k.gemm(tokens, h, m.intermediate // tp),
            "allreduce": 2 * k.all_reduce(tokens * h, tp, graph) if tp > 1 else 0.0,
            "elementwise": self.elementwise.time(
                4 * tokens * h * b,  # add + RMSNorm: read x, residual; write both
                2 * tokens * (m.q_dim + m.kv_dim) / tp * b,  # RoPE on q, k in place
                2 * tokens * 2 * m.kv_dim / tp * b,  # k, v into the KV cache
                4 * tokens * h * b,  # add + RMSNorm before the MLP
                3 * tokens * m.intermediate / tp * b,  # SiLU(gate) * up
            ),
        }
        out.step = {
            "embedding": self.elementwise.time(2 * tokens * h * b)
            + (k.all_reduce(tokens * h, tp, graph) if tp > 1 else 0.0),
            "final_norm": self.elementwise.time(3 * tokens * h * b),
            "lm_head": k.gemm(logits, m.vocab // tp, h),
            "logits_gather": k.all_gather(logits * m.vocab, tp) if tp > 1 else 0.0,
            "overhead": self.overhead_ms,
        }
        return out
