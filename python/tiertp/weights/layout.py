"""Where every tensor lives in a store, and each TP rank's zero-copy view of it.

A `StoreLayout` is computed once, by the process that creates the store,
and travels inside the store's handle, so every attaching process slices
the one buffer identically. Entries are named by the SGLang parameter they
back (``model.layers.0.self_attn.qkv_proj.weight``) and sharded one of four
ways (`SHARDINGS`):

- ``replicated``: every rank sees the whole tensor (norms, row-parallel biases);
- ``fused_column``: the interleaved order of tiertp.weights.interleave; the
  shard of (tp, rank) is rows [rank*B/tp, (rank+1)*B/tp) blocks;
- ``row_transposed``: stored [in, out]; the shard is a row slice, seen as
  its ``.t()`` ([out, in/tp], SGLang's shape);
- ``vocab_rows``: a vocabulary table zero-padded to the largest row count
  any level needs (SGLang pads the vocabulary per TP level: `padded_vocab`);
  the shard is a contiguous row slice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tiertp.weights.errors import UnsupportedLevel
from tiertp.weights.interleave import rows_of_rank

REPLICATED, FUSED_COLUMN, ROW_TRANSPOSED, VOCAB_ROWS = "replicated", "fused_column", "row_transposed", "vocab_rows"
SHARDINGS = (REPLICATED, FUSED_COLUMN, ROW_TRANSPOSED, VOCAB_ROWS)

# Byte alignment of every entry: enough for any dtype and for vectorised
# (CUDA 128-bit, AVX-512) loads from the start of a tensor.
ALIGN = 256
# The store's size is rounded up to whole pages: it is mapped page by page.
PAGE = 4096
# SGLang's DEFAULT_VOCAB_PADDING_SIZE (layers/vocab_parallel_embedding.py).
VOCAB_PADDING = 64

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_of(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise UnsupportedLevel(f"unsupported store dtype {name!r}; expected one of: {', '.join(DTYPES)}")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype | str) -> str:
    if isinstance(dtype, str):
        dtype_of(dtype)
        return dtype
    for name, d in DTYPES.items():
        if d == dtype:
            return name
    raise UnsupportedLevel(f"unsupported store dtype {dtype}; expected one of: {', '.join(DTYPES)}")


def padded_vocab(vocab: int, tp: int) -> int:
    """Rows of SGLang's VocabParallelEmbedding / ParallelLMHead at TP `tp` (no added tokens):
    the vocabulary rounded up to 64 rows, or to 64*tp when that is not divisible by tp."""
    pad = VOCAB_PADDING
    if -(-vocab // pad) * pad % tp:
        pad *= tp
    return -(-vocab // pad) * pad


@dataclass(frozen=True)
class Entry:
    """One stored tensor. `shape` is the storage shape; `offset` is in bytes."""

    name: str
    sharding: str
    shape: tuple[int, ...]
    offset: int = 0
    block_parts: tuple[int, ...] = ()  # fused_column: rows of each part in one block
    vocab_rows: tuple[tuple[int, int], ...] = ()  # vocab_rows: (TP level, padded rows)

    def __post_init__(self):
        if self.sharding not in SHARDINGS:
            raise ValueError(
                f"{self.name}: unknown sharding {self.sharding!r}; expected one of: {', '.join(SHARDINGS)}"
            )

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def shard(self, full: torch.Tensor, blocks: int, tp: int, rank: int) -> torch.Tensor:
        """Rank `rank` of TP `tp`'s view of `full` (this entry's stored tensor)."""
        if self.sharding == REPLICATED:
            return full
        if self.sharding == FUSED_COLUMN:
            start, stop = rows_of_rank(blocks, tp, rank)
            per_block = sum(self.block_parts)
            return full[start * per_block : stop * per_block]
        if self.sharding == ROW_TRANSPOSED:
            start, stop = rows_of_rank(self.shape[0], tp, rank)
            return full[start:stop].t()
        rows = dict(self.vocab_rows)[tp]
        start, stop = rows_of_rank(rows, tp, rank)
        return full[start:stop]


@dataclass(frozen=True)
class StoreLayout:
    """The whole store: candidate TP levels, block count B, dtype, entries, size."""

    architecture: str
    levels: tuple[int, ...]
    blocks: int
    dtype: str
    entries: tuple[Entry, ...]
    nbytes: int

    @classmethod
    def pack(cls, architecture: str, levels, blocks: int, dtype: str, entries: list[Entry]) -> StoreLayout:
        """Assign aligned byte offsets to `entries` in order."""
        itemsize = dtype_of(dtype).itemsize
        placed, offset = [], 0
        for e in entries:
            placed.append(Entry(e.name, e.sharding, tuple(e.shape), offset, tuple(e.block_parts), tuple(e.vocab_rows)))
            offset += -(-e.numel * itemsize // ALIGN) * ALIGN
        nbytes = max(PAGE, -(-offset // PAGE) * PAGE)
        return cls(architecture, tuple(sorted(set(levels))), blocks, dtype, tuple(placed), nbytes)

    @property
    def torch_dtype(self) -> torch.dtype:
        return dtype_of(self.dtype)

    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def entry(self, name: str) -> Entry:
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(f"the weight store has no tensor {name!r}")

    def check_level(self, tp: int, rank: int) -> None:
        if tp not in self.levels:
            raise UnsupportedLevel(
                f"TP {tp} is not a level this weight store was built for (levels {list(self.levels)}, "
                f"{self.blocks} blocks); build the store with TP {tp} among its candidate levels"
            )
        if not 0 <= rank < tp:
            raise UnsupportedLevel(f"rank {rank} outside TP {tp}")

    def full(self, base: torch.Tensor, name: str) -> torch.Tensor:
        """Entry `name`'s whole stored tensor, a view of the byte buffer `base`."""
        e = self.entry(name)
        nbytes = e.numel * self.torch_dtype.itemsize
        return base[e.offset : e.offset + nbytes].view(self.torch_dtype).view(e.shape)

    def shard(self, base: torch.Tensor, name: str, tp: int, rank: int) -> torch.Tensor:
        """Rank `rank` of TP `tp`'s zero-copy view of entry `name`."""
        self.check_level(tp, rank)
        return self.entry(name).shard(self.full(base, name), self.blocks, tp, rank)
