"""Measure one TP level of the real engine, as close to the forward pass as SGLang allows.

Runs inside an isolated process (tiertp.engine.isolated; target
"tiertp.profiling.measure:measure_level"), which starts one process per TP
rank the way SGLang's own `sglang.benchmark.one_batch` does, and loads the
model through SGLang's `ModelRunner` (with CUDA graphs on CUDA). No server,
scheduler loop, tokenizer or detokenizer is involved.

What one timed sample is (rank 0's wall clock, device synchronized on both
sides): SGLang's `one_batch.extend` (prefill) or `one_batch.decode` (one
decode step): building the ScheduleBatch / ForwardBatch for the batch
(KV slot allocation included), `ModelRunner.forward` (all TP ranks, with
their all-reduces) and greedy sampling. That is one scheduler iteration
without the scheduling policy, radix cache and detokenization, which cost
well under a millisecond per iteration on a GPU host.

Cells:
- prefill (batch_tokens T, batch_size B): B fresh prompts of random token
  ids totalling T tokens; the KV pools are cleared before every run.
- decode (batch_size B, context_len C): for each C, the largest B of the grid
  that fits the KV pool is prefilled once (not timed, in groups no larger
  than the grid's largest prefill); then, from the largest batch size down, the
  batch is cut to B requests (`ScheduleBatch.filter_batch`, as the scheduler
  does when requests finish), `warmup` steps run untimed and `repeats` steps
  are timed. Context therefore grows during the measurement, by at most
  `Grid.decode_steps_per_context()` tokens; the table records C, the context
  before the first step (the drift is stated in the profile's provenance).
  Cells whose requests do not fit the KV pool (large B x C on a GPU with
  little memory left) are recorded as infeasible; the writer fills them.

Every measured cell is appended to the checkpoint at once by rank 0, so an
interrupted level loses at most the cell in progress. All ranks run the same
sequence of forwards (they must, for the collectives).
"""

from __future__ import annotations

import statistics
import time

from tiertp.engine import sglang_compat
from tiertp.engine.rank_processes import run_rank_processes
from tiertp.profiling.checkpoint import append_record
from tiertp.profiling.grid import DECODE, PREFILL, Cell, Grid, prompt_lengths

# Token ids for synthetic prompts are drawn below this (and the vocab size).
_MAX_TOKEN_ID = 10_000


def measure_level(job: dict) -> dict:
    """Measure `job["cells"]` at TP `job["tp"]`; results go to `job["checkpoint"]`.

    Job keys: model_path, tp, device, grid (Grid.to_dict()), cells (list of
    [table, x, y] still to measure), checkpoint (path), max_total_tokens,
    cores_per_rank (CPU), seed. Returns {"measured": n}.
    """
    device, tp = job["device"], int(job["tp"])
    if device == "cuda":
        sglang_compat.check_cuda_available()
    sglang_compat.apply(device, tp, job.get("cores_per_rank"))
    from sglang.srt.arg_groups.overrides import declare_resolution
    from sglang.srt.entrypoints.engine import _set_envs_and_config
    from sglang.srt.model_executor.cuda_graph_config import Phase
    from sglang.srt.server_args import PortArgs, ServerArgs

    grid = Grid.from_dict(job["grid"])
    kwargs = sglang_compat.engine_kwargs(device, tp, max_total_tokens=job.get("max_total_tokens"))
    kwargs.pop("skip_server_warmup")  # a server option; no server here
    server_args = ServerArgs(model_path=job["model_path"], **kwargs)
    if device == "cuda":
        # As one_batch does: capture decode CUDA graphs up to the largest batch measured.
        declare_resolution(
            server_args,
            "tiertp.profile",
            cuda_graph_config={Phase.DECODE: {"max_bs": max(grid.decode_batch_size)}},
        )
    server_args.resolve_once()
    _set_envs_and_config(server_args)
    port_args = PortArgs.init_new(server_args)

    if tp == 1:
        _rank_main(server_args, port_args, job, 0, 0)
    else:
        run_rank_processes(_rank_main, [(server_args, port_args, job, r, r) for r in range(tp)],
                           f"TP{tp} measurement", device)
    return {"measured": len(job["cells"])}


def _rank_main(server_args, port_args, job: dict, gpu_id: int, tp_rank: int) -> None:
    """One TP rank: load the model, run every cell of the job; rank 0 records."""
    import numpy as np
    import torch
    from sglang.benchmark import one_batch
    from sglang.srt.runtime_context import SpawnRanks, publish, spawn_world_rank

    # As one_batch.latency_test: a new rank arrives with nothing published.
    publish(
        server_args,
        role="scheduler",
        ranks=SpawnRanks(world_rank=spawn_world_rank(server_args, tp_rank=tp_rank, pp_rank=0), gpu_id=gpu_id),
    )
    one_batch._init_process_global_configs()
    if server_args.device == "cpu":
        from tiertp.engine import cpu_attention  # the attention the served CPU engine runs

        cpu_attention.install()
    runner, _tokenizer = one_batch.load_model(server_args, port_args, gpu_id, tp_rank)
    grid = Grid.from_dict(job["grid"])
    capacity = int(runner.torch_runner.max_total_num_tokens)
    if capacity < max(grid.prefill_batch_tokens):
        raise RuntimeError(
            f"TP{job['tp']}: the KV pool holds {capacity} tokens, fewer than the largest prefill "
            f"of the grid ({max(grid.prefill_batch_tokens)}); use a device with more memory"
        )
    drift = grid.decode_steps_per_context()
    rng = np.random.default_rng(int(job.get("seed", 0)))
    vocab = min(_MAX_TOKEN_ID, runner.torch_runner.model_config.vocab_size)
    tp = int(job["tp"])
    record = tp_rank == 0

    def sync():
        runner.synchronize()

    next_rid = iter(range(1 << 62))

    def reqs_for(lengths):
        ids = [rng.integers(0, vocab, n).tolist() for n in lengths]
        reqs = one_batch.prepare_synthetic_inputs_for_latency_test(len(ids), None, ids)
        for r in reqs:  # one_batch numbers each call's requests from 0
            r.rid = str(next(next_rid))
        return reqs

    def prefill_context(batch_size: int, ctx_len: int):
        """batch_size requests of ctx_len tokens, prefilled (untimed) into one decode batch.

        Prefilled in groups of at most the grid's largest prefill (at least one
        request each), so building a long context never needs more activation
        memory than the prefill cells already did; the groups are merged as
        the scheduler merges a new prefill into its running batch.
        """
        per_group = max(1, max(grid.prefill_batch_tokens) // ctx_len)
        next_ids, batch = None, None
        for start in range(0, batch_size, per_group):
            ids, _, part = runner.extend(reqs_for([ctx_len] * min(per_group, batch_size - start)))
            if batch is None:
                next_ids, batch = ids, part
            else:
                batch.merge_batch(part)
                next_ids = torch.cat([next_ids, ids])
        if batch.seq_lens.tolist() != [ctx_len] * batch_size:  # the cells would time the wrong context
            raise RuntimeError(f"context prefill produced seq_lens {batch.seq_lens.tolist()}, expected {ctx_len} x {batch_size}")
        return next_ids, batch

    def fits(batch_size: int, ctx_len: int) -> bool:
        return batch_size * (ctx_len + drift + 1) <= capacity

    def emit(cell: Cell, samples_s: list[float]) -> None:
        if record:
            ms = [s * 1e3 for s in samples_s]
            append_record(
                job["checkpoint"],
                {
                    "kind": "cell",
                    "tp": tp,
                    "table": cell.table,
                    "x": cell.x,
                    "y": cell.y,
                    "latency_ms": statistics.median(ms),
                    "spread_ms": max(ms) - min(ms),
                    "samples_ms": ms,
                },
            )

    def emit_infeasible(cell: Cell) -> None:
        if record:
            append_record(
                job["checkpoint"],
                {
                    "kind": "infeasible",
                    "tp": tp,
                    "table": cell.table,
                    "x": cell.x,
                    "y": cell.y,
                    "reason": f"{cell.x} requests x {cell.y}+{drift} tokens exceed the KV pool ({capacity} tokens)",
                },
            )

    todo = [Cell(t, int(x), int(y)) for t, x, y in job["cells"]]
    with torch.no_grad():
        # Level warm-up: the first forwards of a fresh process pay one-off costs
        # (allocator growth, lazy kernel/thread-pool setup) no cell should see.
        for _ in range(2):
            runner.clear()
            ids, _, batch = runner.extend(reqs_for([max(grid.prefill_batch_tokens)]))
            runner.decode(ids, batch)
        runner.clear()
        for cell in [c for c in todo if c.table == PREFILL]:
            samples = []
            for run in range(grid.warmup + grid.repeats):
                runner.clear()
                reqs = reqs_for(prompt_lengths(cell.x, cell.y))
                sync()
                tic = time.perf_counter()
                runner.extend(reqs)
                sync()
                if run >= grid.warmup:
                    samples.append(time.perf_counter() - tic)
            emit(cell, samples)

        decode = [c for c in todo if c.table == DECODE]
        for ctx_len in sorted({c.y for c in decode}):
            # Measure every batch size of the grid on this context (the batch is
            # cut from the largest down) but record only the cells still to do,
            # so a resumed run sees the same context drift as a fresh one.
            wanted = {c.x for c in decode if c.y == ctx_len}
            sizes = [b for b in sorted(grid.decode_batch_size, reverse=True) if fits(b, ctx_len)]
            for bs in sorted(wanted - set(sizes)):
                emit_infeasible(Cell(DECODE, bs, ctx_len))
            if not sizes:
                continue
            runner.clear()
            next_ids, batch = prefill_context(sizes[0], ctx_len)
            for bs in sizes:
                if len(batch.reqs) > bs:
                    batch.filter_batch(keep_indices=list(range(bs)))
                    next_ids = next_ids[:bs]
                samples = []
                for step in range(grid.warmup + grid.repeats):
                    sync()
                    tic = time.perf_counter()
                    next_ids, _ = runner.decode(next_ids, batch)
                    sync()
                    if step >= grid.warmup:
                        samples.append(time.perf_counter() - tic)
                if bs in wanted:
                    emit(Cell(DECODE, bs, ctx_len), samples)
            runner.clear()

    if record:
        append_record(
            job["checkpoint"],
            {
                "kind": "level",
                "tp": tp,
                # On CPU the pool is what this job configured, not a device limit.
                "kv_capacity_tokens": capacity if job["device"] == "cuda" else None,
                "threads_bind": sglang_compat.process_env(job["device"], tp, job.get("cores_per_rank")).get(
                    "SGLANG_CPU_OMP_THREADS_BIND"
                ),
                "cuda_graphs": job["device"] == "cuda",
            },
        )
    if tp > 1:
        from sglang.srt.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()
        destroy_distributed_environment()
