"""Benchmark presets: named sets of `tiertp replay` arguments (`tiertp
replay --preset NAME`). bench/presets.toml holds the paper's evaluation
settings; other files of the same form (`--presets FILE`) hold other grids,
e.g. bench/robustness.toml, settings the paper does not evaluate.

They live in a source checkout (beside the tier files and results they
name); an installed wheel has no bench/, and asking for a preset there fails
saying so.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from tiertp.traces import TraceError, parse_fractions

# python/tiertp/replay/presets.py -> the repository root
REPO_ROOT = Path(__file__).resolve().parents[3]
BENCH_DIR = REPO_ROOT / "bench"
PRESETS_FILE = BENCH_DIR / "presets.toml"
# Where a preset's report goes unless --out says otherwise: bench/results/NAME/.
RESULTS_DIR = BENCH_DIR / "results"
# `--preset all`: every preset, each into its own folder.
ALL_PRESETS = "all"

# preset key -> the `tiertp replay` argument (argparse dest) it sets
KEYS: dict[str, str] = {
    "gpu": "gpu", "model": "model", "config": "config", "gpus": "gpus", "tiers": "tiers", "rps": "rps",
    "traces": "trace", "tier_fractions": "tier_fractions", "duration": "duration", "policies": "policies",
}
# A preset names its model by a shipped table (`model`) or by a config.json
# (`config`, composed for `gpu` at run time), exactly one; fractions are
# optional (without them the traces' tiers are used).
OPTIONAL = {"model", "config", "tier_fractions"}


@dataclass(frozen=True)
class Preset:
    """One setting; `args` maps argparse dests (see KEYS) to values, with
    `tiers` an absolute path."""

    name: str
    args: dict

    def merged(self, given: dict) -> dict:
        """The preset's arguments, each replaced by the one in `given` that
        is not None or empty (a flag given on the command line wins)."""
        return {dest: given[dest] if given.get(dest) not in (None, []) else value
                for dest, value in self.args.items()}


def _bad(path: Path, where: str, what: str) -> ValueError:
    return ValueError(f"{path}: {where}: {what}")


def _check(path: Path, name: str, values: dict) -> dict:
    """`values` (a preset merged over [defaults]) as argparse dests, types
    checked; the tier file and model config paths made absolute (relative to
    the presets file)."""
    where = f"preset {name!r}"
    unknown = sorted(set(values) - set(KEYS))
    if unknown:
        raise _bad(path, where, f"unknown key(s) {unknown}; valid: {', '.join(KEYS)}")
    missing = [k for k in KEYS if k not in values and k not in OPTIONAL]
    if missing:
        raise _bad(path, where, f"missing {missing} (set them in [preset.{name}] or [defaults])")
    if ("model" in values) == ("config" in values):
        raise _bad(path, where, "give the model as exactly one of `model` (a shipped table) or `config` "
                                "(a config.json to compose a profile from)")
    gpus, rps, traces, duration = values["gpus"], values["rps"], values["traces"], values["duration"]
    if not (isinstance(gpus, int) and gpus >= 1):
        raise _bad(path, where, f"gpus must be an integer >= 1, got {gpus!r}")
    if not (isinstance(rps, list) and rps and all(isinstance(r, (int, float)) and r > 0 for r in rps)):
        raise _bad(path, where, f"rps must be a list of numbers > 0, got {rps!r}")
    if not (isinstance(traces, list) and traces and all(isinstance(t, str) for t in traces)):
        raise _bad(path, where, f"traces must be a list of trace names, got {traces!r}")
    if not (isinstance(duration, (int, float)) and duration > 0):
        raise _bad(path, where, f"duration must be a number > 0 (seconds), got {duration!r}")
    for key in ("gpu", "model", "config", "tiers", "policies", "tier_fractions"):
        if key in values and not isinstance(values[key], str):
            raise _bad(path, where, f"{key} must be a string, got {values[key]!r}")
    if "tier_fractions" in values:
        try:
            parse_fractions(values["tier_fractions"])
        except TraceError as e:
            raise _bad(path, where, str(e)) from None
    out = {dest: values.get(key) for key, dest in KEYS.items()}
    for key, what in (("tiers", "tier file"), ("config", "model config")):
        if key in values:
            file = (path.parent / values[key]).resolve()
            if not file.is_file():
                raise _bad(path, where, f"{what} {file} does not exist")
            out[key] = str(file)
    out.update(rps=[float(r) for r in rps], duration=float(duration))
    return out


def load_presets(path: Path = PRESETS_FILE) -> dict[str, Preset]:
    """Every preset in `path`, in file order."""
    if not path.is_file():
        raise FileNotFoundError(
            f"no benchmark presets at {path}: presets live in the bench/ folder of a source checkout "
            "of tiertp, not in an installed package; run from the repository, or give the flags yourself")
    doc = tomllib.loads(path.read_text())
    unknown = sorted(set(doc) - {"defaults", "preset"})
    if unknown:
        raise _bad(path, "top level", f"unknown table(s) {unknown}; valid: defaults, preset")
    defaults, presets = doc.get("defaults", {}), doc.get("preset", {})
    if not presets:
        raise _bad(path, "top level", "no [preset.NAME] tables")
    if ALL_PRESETS in presets:
        raise _bad(path, f"preset {ALL_PRESETS!r}", "the name is reserved (--preset all runs every preset)")
    return {name: Preset(name, _check(path, name, {**defaults, **values})) for name, values in presets.items()}


def results_dir(path: Path = PRESETS_FILE) -> Path:
    """Where the presets of `path` write their reports by default:
    bench/results/ for the paper's, bench/results/STEM/ for another file's."""
    return RESULTS_DIR if path.resolve() == PRESETS_FILE.resolve() else RESULTS_DIR / path.stem


def select(spec: str, path: Path = PRESETS_FILE) -> list[Preset]:
    """The presets `spec` names: one name, or `all`; an unknown name fails
    listing the valid ones."""
    presets = load_presets(path)
    if spec == ALL_PRESETS:
        return list(presets.values())
    if spec not in presets:
        raise ValueError(f"unknown preset {spec!r}; valid: {ALL_PRESETS}, {', '.join(presets)} (from {path})")
    return [presets[spec]]
