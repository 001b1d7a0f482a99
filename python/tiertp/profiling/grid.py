"""What `tiertp profile` measures: the grids, their cells, and the TP list.

A profile table is rectangular (see rust-scheduler/core/src/profile/schema.rs):
- prefill: latency by (batch_tokens x batch_size): one forward over
  batch_size prompts totalling batch_tokens tokens;
- decode: step latency by (batch_size x context_len): one decode step of
  batch_size requests, each with context_len tokens of context.

A prefill cell with batch_size > batch_tokens is impossible (every prompt
needs at least one token); it is not measured but filled with the value of
the nearest feasible cell (same batch_tokens, largest feasible batch_size),
and the profile's provenance lists it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tiertp._scheduler import PRIOR_OUTPUT_TOKENS, PRIOR_PROMPT_TOKENS

PREFILL = "prefill"
DECODE = "decode"
TABLES = (PREFILL, DECODE)


@dataclass(frozen=True)
class Grid:
    prefill_batch_tokens: tuple[int, ...]
    prefill_batch_size: tuple[int, ...]
    decode_batch_size: tuple[int, ...]
    decode_context_len: tuple[int, ...]
    warmup: int  # untimed runs before each cell
    repeats: int  # timed runs per cell (median and spread over these)

    def __post_init__(self):
        for name in ("prefill_batch_tokens", "prefill_batch_size", "decode_batch_size", "decode_context_len"):
            axis = getattr(self, name)
            if not axis or any(v <= 0 for v in axis) or list(axis) != sorted(set(axis)):
                raise ValueError(f"grid axis {name} must be non-empty, positive and strictly increasing: {axis}")
        if self.warmup < 0 or self.repeats < 1:
            raise ValueError(f"need warmup >= 0 and repeats >= 1, got {self.warmup}, {self.repeats}")

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> Grid:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})

    def axes(self, table: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(x axis, y axis) of `table`, in the profile format's order."""
        if table == PREFILL:
            return self.prefill_batch_tokens, self.prefill_batch_size
        if table == DECODE:
            return self.decode_batch_size, self.decode_context_len
        raise ValueError(f"unknown table {table!r}; expected one of {TABLES}")

    def decode_steps_per_context(self) -> int:
        """Decode steps run on one prefilled batch (all batch sizes, warm-up included)."""
        return len(self.decode_batch_size) * (self.warmup + self.repeats)

    def kv_tokens_needed(self) -> int:
        """KV slots the measurement needs at once (the engine's pool must hold them)."""
        prefill = max(self.prefill_batch_tokens)
        decode = max(self.decode_batch_size) * (max(self.decode_context_len) + self.decode_steps_per_context() + 1)
        return max(prefill, decode)


@dataclass(frozen=True, order=True)
class Cell:
    table: str
    x: int
    y: int

    @property
    def key(self) -> str:
        return f"{self.table}:{self.x}:{self.y}"


def feasible(cell: Cell) -> bool:
    if cell.table == PREFILL:
        return cell.y <= cell.x  # batch_size <= batch_tokens
    return True


def cells(grid: Grid, table: str) -> list[Cell]:
    """All cells of `table`, row-major (x outer, y inner)."""
    xs, ys = grid.axes(table)
    return [Cell(table, x, y) for x in xs for y in ys]


def measured_cells(grid: Grid) -> list[Cell]:
    """The cells that are measured (feasible ones), prefill then decode."""
    return [c for t in TABLES for c in cells(grid, t) if feasible(c)]


def nearest_feasible(cell: Cell, grid: Grid) -> Cell:
    """The measured cell whose value fills an infeasible `cell`."""
    if feasible(cell):
        return cell
    _, ys = grid.axes(cell.table)
    candidates = [y for y in ys if feasible(Cell(cell.table, cell.x, y))]
    if not candidates:
        raise ValueError(f"grid has no feasible cell in row {cell.table} x={cell.x}: {grid}")
    return Cell(cell.table, cell.x, max(candidates))


def prompt_lengths(batch_tokens: int, batch_size: int) -> list[int]:
    """Split batch_tokens over batch_size prompts as evenly as possible."""
    if not 1 <= batch_size <= batch_tokens:
        raise ValueError(f"cannot split {batch_tokens} tokens over {batch_size} prompts")
    base, extra = divmod(batch_tokens, batch_size)
    return [base + (1 if i < extra else 0) for i in range(batch_size)]


# On CPU one core stands in for one device by default: TP k runs k
# single-threaded ranks. Splitting all cores over the ranks instead would give
# TP1 every core and make the table compare core counts rather than TP
# levels; single-threaded ranks are also far less disturbed by other load.
CPU_CORES_PER_RANK = 1

# The longest decode context the CPU grids and the quick CUDA grid measure:
# the control loop's prior request at its last token, which a plan made at
# start-up asks the profile for (past the axis the profile clamps, which
# underestimates a decode step).
_PRIOR_CONTEXT = int(PRIOR_PROMPT_TOKENS + PRIOR_OUTPUT_TOKENS)

# The one list of grids, by (device, quick). CPU grids are sized for a
# 2-core machine. The quick ones take about a minute and a half per TP level
# for SmolLM2-135M and still span what a served request does (prompts up to
# 1024 tokens, decode batches up to 16, the prior request's context): `tiertp
# serve` plans with one.
GRIDS: dict[tuple[str, bool], Grid] = {
    # key: Grid(prefill_batch_tokens, prefill_batch_size, decode_batch_size, decode_context_len, warmup, repeats)
    ("cpu", False): Grid((16, 64, 256, 1024), (1, 2, 4, 8), (1, 2, 4, 8, 16), (64, 256, _PRIOR_CONTEXT), 1, 3),
    ("cpu", True): Grid((8, 128, 1024), (1, 4), (1, 4, 16), (32, _PRIOR_CONTEXT), 1, 2),
    ("cuda", False): Grid((128, 512, 1024, 2048, 4096, 8192, 16384), (1, 2, 4, 8, 16, 32),
                          (1, 2, 4, 8, 16, 32, 64, 128, 256), (128, 512, 1024, 2048, 4096, 8192), 2, 5),
    ("cuda", True): Grid((128, 1024, 4096), (1, 4), (1, 8, 32), (128, _PRIOR_CONTEXT), 1, 3),
}


def grid_for(device: str, quick: bool) -> Grid:
    try:
        return GRIDS[(device, quick)]
    except KeyError:
        devices = sorted({d for d, _ in GRIDS})
        raise ValueError(f"no grid for device {device!r}; expected one of: {', '.join(devices)}") from None


MAX_TP = 8


def parse_tp_list(text: str) -> list[int]:
    """Parse --tp ("1,3"): distinct integers 1..8, returned ascending."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise ValueError(f"bad --tp list {text!r}: expected comma-separated TP levels, e.g. 1,2,4")
    levels = []
    for p in parts:
        if not p.isdigit() or not 1 <= int(p) <= MAX_TP:
            raise ValueError(f"bad --tp list {text!r}: {p!r} is not a TP level from 1 to {MAX_TP}")
        levels.append(int(p))
    if len(set(levels)) != len(levels):
        raise ValueError(f"bad --tp list {text!r}: a TP level is repeated")
    return sorted(levels)


def check_tp_fits_model(tp_levels: list[int], num_heads: int, num_kv_heads: int, model: str) -> None:
    """Every TP level must divide the attention heads (and KV heads, or be a multiple of them)."""
    bad = [
        tp
        for tp in tp_levels
        if num_heads % tp != 0 or (num_kv_heads % tp != 0 and tp % num_kv_heads != 0)
    ]
    if bad:
        raise ValueError(
            f"TP level(s) {bad} do not fit {model}: it has {num_heads} attention heads and "
            f"{num_kv_heads} KV heads (each TP level must divide the attention heads)"
        )
