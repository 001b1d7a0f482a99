"""Per-iteration decode time of the two step runners (a quick comparison, not a test).

    .venv/bin/python tests/compare_runners.py [--model smollm2-135m] [--batch 1 8]

For each runner (tiertp.worker.runners.RUNNERS) and batch size, in its own
isolated process: start the runner at TP1, step once with `batch` fresh
prompts (the prefill), then time `repeats` decode steps through
`StepRunner.step` (what the execution process calls each iteration) after
`warmup` untimed ones. With `--rounds N` the runners alternate N times (on a
shared, busy machine the best round is the least disturbed one). Prints one
JSON object: per runner and batch size, the median ms per step of each
round, the best of those medians, and the fastest single step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path

from tiertp.engine.isolated import run_isolated
from tiertp.execution.records import Sampling
from tiertp.tp_group import TpGroup
from tiertp.worker.runners import RUNNERS, make_runner
from tiertp.worker.step_runner import StepInput

# The isolated child imports this file as the module `compare_runners` from here.
_HERE = str(Path(__file__).resolve().parent)


def measure(job: dict) -> dict:
    """Run in an isolated process: {batch: {"median_ms", "min_ms"}} for one runner."""
    runner = make_runner(job["runner"], job["model"], TpGroup(0, 1), job["max_total_tokens"])
    runner.start()
    rng = random.Random(0)
    out, next_rid = {}, 0
    try:
        for batch in job["batches"]:
            reqs = {}
            for _ in range(batch):
                reqs[next_rid] = [rng.randrange(100, 10_000) for _ in range(job["prompt_len"])]
                next_rid += 1
            times = []
            for step in range(1 + job["warmup"] + job["repeats"]):
                inputs = [StepInput(rid, toks, len(toks) - job["prompt_len"], Sampling())
                          for rid, toks in reqs.items()]
                tic = time.perf_counter()
                outs = runner.step(inputs)
                if step > job["warmup"]:
                    times.append(time.perf_counter() - tic)
                for o in outs:
                    reqs[o.rid].append(o.token)
            runner.release(list(reqs))
            out[str(batch)] = {"median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3}
    finally:
        runner.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tests/compare_runners.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--max-total-tokens", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args(argv)
    rounds = {name: [] for name in RUNNERS}
    for _ in range(args.rounds):
        for name in RUNNERS:
            job = {"runner": name, "model": args.model, "batches": args.batch, "prompt_len": args.prompt_len,
                   "warmup": args.warmup, "repeats": args.repeats, "max_total_tokens": args.max_total_tokens}
            rounds[name].append(run_isolated(measure, job, timeout_s=900, env=_child_env()))
    summary = {name: {str(b): {"median_ms_per_round": [round(r[str(b)]["median_ms"], 2) for r in runs],
                               "best_median_ms": round(min(r[str(b)]["median_ms"] for r in runs), 2),
                               "min_ms": round(min(r[str(b)]["min_ms"] for r in runs), 2)}
                      for b in args.batch}
               for name, runs in rounds.items()}
    print(json.dumps({"model": args.model, "tp": 1, "prompt_len": args.prompt_len, "repeats": args.repeats,
                      "rounds": args.rounds, "machine": platform.node(), "cpus": os.cpu_count(),
                      "decode_step": summary}, indent=2))
    return 0


def _child_env() -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(p for p in (_HERE, os.environ.get("PYTHONPATH", "")) if p)}


if __name__ == "__main__":
    raise SystemExit(main())
