"""TP switch stop time (pause -> resume) on CPU vs restarting the engine at the new TP level.

Two warm instances of the model (default tiny-llama: random weights, 8 KV
heads, 2 layers, head dim 32, float32, so 4 KiB of KV per token at TP1) on
devices 0..k-1: the source at --from-tp, the destination at --to-tp. For each
--tokens size the source is given that many tokens of live KV (decoding
requests of up to one context length each, imported with reserve_slots +
adopt so nothing has to be prefilled first, then one iteration so they are in
the running batch), switched to the destination with
tiertp.switching.SwitchCoordinator (timed: the coordinator's pause -> resume
`stop_ms`), then moved back (not timed) and released; --repeat rounds, the
median reported (every round listed). 0 tokens is a switch with no running
request. `restart_ms` is starting a fresh TpInstance at --to-tp until it is
ready (what a switch by restarting the engine would cost), measured after
the warm instances are closed. `moved.bytes_pulled`: the part of the KV the
destination ranks copied straight out of the source's pool (all of it when
its pool is in shared memory, as `warm` arranges on CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-llama", help="embedded model name or HF model directory")
    p.add_argument("--from-tp", type=int, default=1)
    p.add_argument("--to-tp", type=int, default=2)
    p.add_argument("--tokens", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1024, 8192, 32768],
                   help="comma-separated live KV sizes in tokens (default 0,1024,8192,32768)")
    p.add_argument("--repeat", type=int, default=5, help="timed switches per size (the median is reported)")


@contextlib.contextmanager
def _stdout_to_stderr():
    """SGLang's rank processes print to the stdout they inherit; keep it for the JSON."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _fill(src, tokens: int, per_request: int, tag: str) -> list:
    """Import `tokens` tokens of KV into `src` as decoding requests, run one iteration; their ids."""
    from tiertp.execution.records import RequestState, Sampling

    sizes = [per_request] * (tokens // per_request) + ([tokens % per_request] if tokens % per_request else [])
    if not sizes:
        return []
    slots = src.reserve_slots(sizes)
    states = [RequestState(f"{tag}-{i}", tuple([7] * n + [8]), n, n, tuple(s), Sampling())
              for i, (n, s) in enumerate(zip(sizes, slots))]
    src.adopt(states)
    src.iterate()  # each extends its last token and joins the running batch
    return [s.rid for s in states]


def run(args) -> dict:
    from tiertp.execution.instance import TpInstance
    from tiertp.execution.spec import InstanceSpec
    from tiertp.switching import SwitchCoordinator

    if args.repeat < 1:
        raise ValueError(f"--repeat must be >= 1, got {args.repeat}")
    most = max(args.tokens)
    # Room for the largest live KV plus the one token each request decodes.
    capacity = most + most // 256 + 1024

    def spec(tp: int) -> InstanceSpec:
        return InstanceSpec(args.model, tp=tp, max_total_tokens=capacity)

    stop, parts, moved = {}, {}, {}
    with _stdout_to_stderr(), TpInstance(spec(args.from_tp)) as src, TpInstance(spec(args.to_tp)) as dst, \
            SwitchCoordinator() as coord:
        info = src.start()
        dst.start()
        coord.warm(src, dst)  # as the node agent does once its instances are up
        per_request = info.context_len - 2
        for tokens in args.tokens:
            samples = []
            for round_ in range(args.repeat):
                rids = _fill(src, tokens, per_request, f"t{tokens}r{round_}")
                there = coord.switch([(src, rids)], dst)
                samples.append(there)
                coord.switch([(dst, rids)], src)
                src.resume()
                if rids:
                    src.release(rids)
            key = str(tokens)
            stop[key] = [round(r.stop_ms, 3) for r in samples]
            mid = sorted(samples, key=lambda r: r.stop_ms)[len(samples) // 2]
            parts[key] = {k: round(v, 3) for k, v in mid.parts_ms.items()}
            moved[key] = {"kv_tokens": mid.kv_tokens, "bytes_between": mid.bytes_between,
                          "bytes_pulled": mid.bytes_pulled}
    with _stdout_to_stderr():
        start = time.perf_counter()
        with TpInstance(spec(args.to_tp)) as fresh:
            fresh.start()
            restart_ms = (time.perf_counter() - start) * 1e3
    medians = {k: round(statistics.median(v), 3) for k, v in stop.items()}
    return {
        "model": args.model, "from_tp": args.from_tp, "to_tp": args.to_tp,
        "stop_ms": medians, "stop_ms_rounds": stop, "parts_ms_of_median": parts, "moved": moved,
        "restart_ms": round(restart_ms, 1),
        "restart_over_stop": {k: round(restart_ms / v, 1) for k, v in medians.items() if v > 0},
        "targets": {"stop_ms_no_kv": 15.0, "restart_over_stop": 100.0},
    }
