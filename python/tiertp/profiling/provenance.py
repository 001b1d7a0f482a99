"""The provenance block of a measured profile: where, with what, and how it was measured."""

from __future__ import annotations

import datetime as _dt
import platform
import re
from importlib import metadata
from pathlib import Path

from tiertp.engine import sglang_compat

MEASUREMENT = (
    "rank 0 wall clock around one SGLang iteration without a server: sglang.benchmark.one_batch "
    "extend (prefill) or decode (one step) = ScheduleBatch/ForwardBatch construction (KV slot "
    "allocation included) + ModelRunner.forward on all TP ranks (all-reduces included) + greedy "
    "sampling; device synchronized before and after. Random token ids; KV pools cleared between "
    "prefill runs. No scheduling policy, radix cache, tokenizer or detokenizer."
)
SPREAD = "spread_ms = max - min over the timed repeats of a cell; latency_ms = their median"


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: str) -> str:
    """The profile's `gpu` field: "cpu", or the CUDA device name as a slug (e.g. nvidia_h100_80gb_hbm3)."""
    if device == "cpu":
        return "cpu"
    import torch

    return re.sub(r"[^a-z0-9]+", "_", torch.cuda.get_device_name(0).lower()).strip("_")


def machine(device: str) -> dict:
    info = {
        "cpu": cpu_name(),
        "cores_usable": sglang_compat.cpu_count(),
        "system": platform.platform(),
        "python": platform.python_version(),
    }
    if device == "cuda":
        import torch

        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
        info["cuda"] = torch.version.cuda
    return info


def describe(req, grid, model_path: Path, progress, *, max_total_tokens: int | None, cores_per_rank: int) -> dict:
    """Provenance for a finished run (`req` is a runner.ProfileRequest)."""
    notes = []
    cores = sglang_compat.cpu_count()
    oversub = {str(tp): tp * cores_per_rank > cores for tp in req.tp_levels} if req.device == "cpu" else {}
    for tp, over in oversub.items():
        if over:
            notes.append(
                f"TP{tp} ran {tp} ranks on {cores} CPU cores: ranks share cores, so its latencies "
                f"include CPU contention and overstate what TP{tp} on {tp} separate devices would take"
            )
    if req.device == "cpu":
        notes.append(
            f"each TP rank ran on {cores_per_rank} core(s) (OMP_NUM_THREADS={cores_per_rank}): "
            f"on CPU {cores_per_rank} core(s) stand in for a device, so TP k uses k x {cores_per_rank} cores"
        )
        notes.append(
            "no kv_capacity_tokens: on CPU the KV pool is sized by the measurement "
            "(settings.engine.max_total_tokens), not limited by device memory"
        )
    kwargs = sglang_compat.engine_kwargs(req.device, 1, max_total_tokens=max_total_tokens)
    for k in ("tp_size", "skip_server_warmup", "log_level"):
        kwargs.pop(k)
    return {
        "tool": "tiertp profile",
        "tiertp": package_version("tiertp"),
        "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "machine": machine(req.device),
        "software": {"sglang": package_version("sglang"), "torch": package_version("torch")},
        "model_path": str(model_path),
        "device": req.device,
        "settings": {
            "engine": kwargs,
            "cuda_graphs": req.device == "cuda",
            "grid": grid.to_dict(),
            "quick": req.quick,
            "seed": req.seed,
            "threads_bind": {
                str(tp): (progress.levels.get(tp) or {}).get("threads_bind") for tp in req.tp_levels
            }
            if req.device == "cpu"
            else None,
            "cores_per_rank": cores_per_rank if req.device == "cpu" else None,
            "oversubscribed": oversub or None,
            "tp_backend": "gloo" if req.device == "cpu" else "nccl",
        },
        "measurement": MEASUREMENT,
        "spread": SPREAD,
        "decode_context_drift_tokens": grid.decode_steps_per_context(),
        "decode_context_note": (
            "context_len is the context before the first decode step of a cell; each context's "
            "batch is prefilled once and cut from the largest batch size down, so the context grows "
            "by up to decode_context_drift_tokens during its cells"
        ),
        "notes": notes,
    }
