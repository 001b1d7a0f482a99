"""Measured kernel latencies of one GPU type, queryable at any shape.

Source: the aiconfigurator SGLang collections in
`<data>/gpu-kernels/<gpu>/` (see ../shared/data/README.md). Latencies are
milliseconds. Only the bf16 rows are used (bf16 weights, activations and KV
cache); NCCL rows are fp16 ("half"), the same bytes per element.

How each table is read between and beyond its measured points (log-log
inside; the `interp` rules outside):
- GEMM (m, n, k): trilinear in log space over the full measured grid;
  beyond the largest m, n or k, PROPORTIONAL (a bigger GEMM is that many of
  the largest measured one, e.g. the 128k-vocab LM head from n = 65536).
- Context (prefill) attention (batch, isl, heads, kv heads): log-log in isl
  per measured batch; beyond the largest measured isl for that batch,
  `power(1, 2)` from the last measured segment (causal attention cost grows
  between linearly and quadratically in length); log-log across batch,
  PROPORTIONAL beyond the largest batch.
- Generation (decode) attention (batch, kv_len, heads, kv heads): the
  collector bounds batch x kv_len, so long contexts at big batches are not
  measured. Decode attention streams the KV cache, so beyond the largest
  measured kv_len for a batch it is `affine` in kv_len with slope
  batch x r, r being the median over the measured batches (same heads) of
  the last measured segment's ms per cached token per sequence: one noisy
  or cache-resident last segment does not set the slope; log-log across
  batch, PROPORTIONAL beyond it.
- Heads: exact (heads, kv heads) rows when measured, else linear in query
  heads between the two nearest measured head counts with the same number
  of KV heads (e.g. Qwen's 20/4 at TP 2 from 16/4 and 32/4).
- All-reduce / all-gather (elements, GPUs): log-log in message size, floor
  below, PROPORTIONAL above.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from statistics import mean, median
from typing import Any

from tiertp.profiles.interp import PROPORTIONAL, AboveRule, affine, blend, bracket, curve_at, power

Row = Mapping[str, Any]
Curve = tuple[list[float], list[float]]
# (heads, kv heads), measured batch -> the rule beyond that curve's last point
AboveFor = Callable[[tuple[int, int], int], AboveRule]
# (heads, kv heads) -> measured batch -> latency curve over isl or kv_len
AttnTable = dict[tuple[int, int], dict[int, Curve]]

# file (under the GPU's folder) -> (columns every row needs, row filter)
TABLE_FILES: dict[str, tuple[str, tuple[str, ...]]] = {
    "gemm": ("gemm/gemm_perf.parquet", ("gemm_dtype", "m", "n", "k", "latency")),
    "context_attention": (
        "attention/context_attention_perf.parquet",
        ("attn_dtype", "kv_cache_dtype", "batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "latency"),
    ),
    "generation_attention": (
        "attention/generation_attention_perf.parquet",
        ("attn_dtype", "kv_cache_dtype", "batch_size", "step", "num_heads", "num_key_value_heads", "head_dim", "latency"),
    ),
    "allreduce": ("comm/custom_allreduce_perf.parquet", ("allreduce_dtype", "backend", "num_gpus", "message_size", "latency")),
    "nccl": ("nccl/nccl_perf.parquet", ("op_name", "nccl_dtype", "num_gpus", "message_size", "latency")),
}

# Which rows stand for bf16 serving.
_KEEP = {
    "gemm": lambda r: r["gemm_dtype"] == "bfloat16",
    "context_attention": lambda r: r["attn_dtype"] == "bfloat16" and r["kv_cache_dtype"] == "bfloat16",
    "generation_attention": lambda r: r["attn_dtype"] == "bfloat16" and r["kv_cache_dtype"] == "bfloat16",
    "allreduce": lambda r: r["allreduce_dtype"] == "bfloat16",
    "nccl": lambda r: r["nccl_dtype"] == "half",
}

# SGLang runs decode inside CUDA graphs and prefill (extend) eagerly; the
# custom all-reduce collection measured both modes.
ALLREDUCE_BACKEND = {True: "sglang_graph", False: "sglang_eager"}

HEAD_DIM = 128  # the only head_dim measured; Composer refuses models with another


def _curve(points: dict[float, list[float]]) -> Curve:
    xs = sorted(points)
    return xs, [mean(points[x]) for x in xs]


class KernelTables:
    """bf16 kernel latencies (ms) of one GPU type. Build with `load` (the
    parquet collection) or `from_records` (rows with the same columns; used
    by tests)."""

    def __init__(self, tables: Mapping[str, Iterable[Row]], source: str) -> None:
        self.source = source
        self.devices: set[str] = set()
        # table -> "framework version" the rows were collected with
        self.versions: dict[str, str] = {}
        gemm: dict[tuple[int, int], dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
        for r in tables.get("gemm", ()):
            gemm[(int(r["n"]), int(r["k"]))][float(r["m"])].append(float(r["latency"]))
        self._gemm = {nk: _curve(p) for nk, p in gemm.items()}
        self._gemm_n = sorted({n for n, _ in self._gemm})
        self._gemm_k = sorted({k for _, k in self._gemm})
        self._context = self._attention(tables.get("context_attention", ()), "isl", 0)
        # `step` is the number of tokens already cached when the new token is
        # decoded, so the attention reads step + 1 tokens: kv_len = step + 1.
        self._generation = self._attention(tables.get("generation_attention", ()), "step", 1)
        # per (heads, kv heads): median ms per cached token per sequence of
        # the last measured segment of each batch (see the module doc)
        self._stream_rate = {
            combo: median(
                max(0.0, (ys[-1] - ys[-2]) / (b * (xs[-1] - xs[-2]))) if len(xs) > 1 else ys[-1] / (b * xs[-1])
                for b, (xs, ys) in per_b.items()
            )
            for combo, per_b in self._generation.items()
        }
        comm: dict[tuple[str, int], dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
        for r in tables.get("allreduce", ()):
            comm[(r["backend"], int(r["num_gpus"]))][float(r["message_size"])].append(float(r["latency"]))
        for r in tables.get("nccl", ()):
            comm[("nccl_" + r["op_name"], int(r["num_gpus"]))][float(r["message_size"])].append(float(r["latency"]))
        self._comm = {key: _curve(p) for key, p in comm.items()}

    @staticmethod
    def _attention(rows: Iterable[Row], x_col: str, x_offset: int) -> AttnTable:
        acc: dict[tuple[int, int], dict[int, dict[float, list[float]]]] = defaultdict(
            lambda: defaultdict(lambda: defaultdict(list))
        )
        for r in rows:
            if int(r.get("head_dim", HEAD_DIM)) != HEAD_DIM:
                continue
            combo = (int(r["num_heads"]), int(r["num_key_value_heads"]))
            acc[combo][int(r["batch_size"])][float(r[x_col]) + x_offset].append(float(r["latency"]))
        return {c: {b: _curve(p) for b, p in per_b.items()} for c, per_b in acc.items()}

    # -- construction ---------------------------------------------------

    @classmethod
    def from_records(cls, source: str = "<records>", **tables: Iterable[Row]) -> KernelTables:
        """Tables from rows already filtered to bf16 (keys: gemm,
        context_attention, generation_attention, allreduce, nccl)."""
        unknown = set(tables) - set(TABLE_FILES)
        if unknown:
            raise ValueError(f"unknown kernel tables {sorted(unknown)}; valid: {', '.join(TABLE_FILES)}")
        return cls({k: list(v) for k, v in tables.items()}, source)

    @classmethod
    def load(cls, gpu_dir: Path, expect_device: str | None = None) -> KernelTables:
        """Reads the five parquet tables under `gpu_dir`, keeping bf16 rows.
        Missing files or columns raise with the file named; so does a
        `device` column that disagrees with `expect_device`."""
        import pyarrow.parquet as pq  # heavy; only the builder needs it

        tables: dict[str, list[dict[str, Any]]] = {}
        devices: set[str] = set()
        versions: dict[str, str] = {}
        for key, (rel, cols) in TABLE_FILES.items():
            path = gpu_dir / rel
            if not path.is_file():
                raise FileNotFoundError(f"{path}: kernel table missing (expected under {gpu_dir})")
            schema_cols = set(pq.read_schema(path).names)
            missing = [c for c in cols if c not in schema_cols]
            if missing:
                raise ValueError(f"{path}: missing column(s) {missing}; has {sorted(schema_cols)}")
            read = [*cols, *(c for c in ("device", "framework", "version") if c in schema_cols)]
            data = pq.read_table(path, columns=read).to_pylist()
            rows = [r for r in data if _KEEP[key](r)]
            if not rows:
                raise ValueError(f"{path}: no bf16 rows")
            bad = [r for r in rows if not (r["latency"] is not None and r["latency"] > 0)]
            if bad:
                raise ValueError(f"{path}: {len(bad)} row(s) with latency <= 0 or null, e.g. {bad[0]}")
            devices |= {r["device"] for r in rows if r.get("device")}
            versions[key] = ", ".join(sorted({f"{r.get('framework', '?')} {r.get('version', '?')}" for r in rows}))
            tables[key] = rows
        if expect_device and devices - {expect_device}:
            raise ValueError(f"{gpu_dir}: measured on {sorted(devices)}, expected {expect_device!r}")
        out = cls(tables, str(gpu_dir))
        out.devices = devices
        out.versions = versions
        return out

    # -- queries --------------------------------------------------------

    def gemm(self, m: float, n: float, k: float) -> float:
        """bf16 GEMM [m x k] @ [k x n]."""
        if not self._gemm:
            raise ValueError(f"{self.source}: no GEMM rows")
        scale = max(1.0, n / self._gemm_n[-1]) * max(1.0, k / self._gemm_k[-1])
        parts = []
        for ni, wn in bracket(self._gemm_n, n):
            for ki, wk in bracket(self._gemm_k, k):
                nk = (self._gemm_n[ni], self._gemm_k[ki])
                if nk not in self._gemm:
                    raise ValueError(f"{self.source}: no GEMM rows for n={nk[0]}, k={nk[1]} (needed for n={n}, k={k})")
                xs, ys = self._gemm[nk]
                parts.append((curve_at(xs, ys, m, PROPORTIONAL), wn * wk))
        return blend(parts) * scale

    def context_attention(self, batch: float, isl: float, heads: int, kv_heads: int) -> float:
        """Prefill attention: `batch` sequences of `isl` new tokens each, no
        cached prefix, `heads`/`kv_heads` on this GPU."""
        rule = power(1.0, 2.0)
        return self._attn(self._context, "context attention", batch, isl, heads, kv_heads, lambda combo, b: rule)

    def generation_attention(self, batch: float, kv_len: float, heads: int, kv_heads: int) -> float:
        """Decode attention: `batch` sequences each attending over `kv_len`
        cached tokens (the new one included)."""

        def above(combo: tuple[int, int], b: int) -> AboveRule:
            return affine(b * self._stream_rate[combo])

        return self._attn(self._generation, "generation attention", batch, kv_len, heads, kv_heads, above)

    def _attn(self, table: AttnTable, what: str, batch: float, x: float, heads: int, kv_heads: int, above: AboveFor) -> float:
        if (heads, kv_heads) in table:
            return self._attn_combo(table, (heads, kv_heads), batch, x, above)
        same_kv = sorted(h for h, kv in table if kv == kv_heads)
        lo = [h for h in same_kv if h < heads]
        hi = [h for h in same_kv if h > heads]
        if not lo or not hi:
            raise ValueError(
                f"{self.source}: {what} has no rows around {heads} heads / {kv_heads} KV heads "
                f"(measured head counts with {kv_heads} KV heads: {same_kv})"
            )
        h0, h1 = lo[-1], hi[0]
        y0 = self._attn_combo(table, (h0, kv_heads), batch, x, above)
        y1 = self._attn_combo(table, (h1, kv_heads), batch, x, above)
        return y0 + (y1 - y0) * (heads - h0) / (h1 - h0)

    @staticmethod
    def _attn_combo(table: AttnTable, combo: tuple[int, int], batch: float, x: float, above: AboveFor) -> float:
        per_batch = table[combo]
        bs = sorted(per_batch)
        parts = [(curve_at(*per_batch[bs[i]], x, above(combo, bs[i])), w) for i, w in bracket(bs, batch)]
        return blend(parts) * max(1.0, batch / bs[-1])

    def all_reduce(self, elements: float, gpus: int, graph: bool) -> float:
        """All-reduce of `elements` bf16 values over `gpus` GPUs: SGLang's
        custom all-reduce (CUDA-graph or eager rows), else NCCL's."""
        key = (ALLREDUCE_BACKEND[graph], gpus)
        if key not in self._comm:
            key = ("nccl_all_reduce", gpus)
        return self._comm_at(key, elements)

    def all_gather(self, elements: float, gpus: int) -> float:
        """NCCL all-gather whose gathered result holds `elements` values."""
        return self._comm_at(("nccl_all_gather", gpus), elements)

    def _comm_at(self, key: tuple[str, int], elements: float) -> float:
        if key not in self._comm:
            have = sorted(f"{name}@{g}" for name, g in self._comm)
            raise ValueError(f"{self.source}: no {key[0]} rows for {key[1]} GPUs (have {have})")
        return curve_at(*self._comm[key], elements, PROPORTIONAL)

    def kernel_floor_ms(self) -> float:
        """The shortest GEMM measured: what launching any small kernel costs."""
        return min(min(ys) for _, ys in self._gemm.values())

    def stream_bandwidth(self) -> float:
        """Bytes/ms the GPU streams from HBM, as seen by the largest
        m = 1 GEMM measured (it reads the whole [k x n] weight once)."""
        n, k = max(((n, k) for n, k in self._gemm if self._gemm[(n, k)][0][0] == 1), key=lambda nk: nk[0] * nk[1])
        return 2.0 * (n * k + n + k) / self._gemm[(n, k)][1][0]
