"""Check a TP level end to end: SGLang's normal load vs. the same model on store views.

Runs inside an isolated process (tiertp.engine.isolated; target
"tiertp.weights.verify:compare_level"). It creates the weight store (so it
owns it, as the node agent would), then starts one process per TP rank the
way tiertp.profiling.measure does. Each rank builds SGLang's ModelRunner the
production way, loading from the store (`loading_from_store`: the model is
bound to its (tp, rank) views inside ModelRunner.load_model, nothing read
from disk), runs a prefill of the prompts and a few greedy decode steps;
then loads a second copy of the model with SGLang's normal loader
(DefaultModelLoader: safetensors, SGLang's own sharding), puts it in the
runner's place, clears the KV pool and runs the same again as the reference.

Job keys: model (embedded name or dir), tp, levels, prompts (lists of token
ids), decode_steps, max_total_tokens (optional), dtype ("float32").
Returns rank 0's tokens and logits differences plus every rank's bind stats.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

from tiertp.engine import sglang_compat
from tiertp.engine.rank_processes import run_rank_processes
from tiertp.engine.models import resolve_model


def compare_level(job: dict) -> dict:
    tp = int(job["tp"])
    model_dir = str(resolve_model(job["model"]))
    sglang_compat.apply("cpu", tp)
    from sglang.srt.entrypoints.engine import _set_envs_and_config
    from sglang.srt.server_args import PortArgs, ServerArgs

    from tiertp.weights.store import create_store

    kwargs = sglang_compat.engine_kwargs("cpu", tp, max_total_tokens=job.get("max_total_tokens"))
    kwargs.pop("skip_server_warmup")
    kwargs["dtype"] = job.get("dtype", "float32")
    server_args = ServerArgs(model_path=model_dir, **kwargs)
    server_args.resolve_once()
    _set_envs_and_config(server_args)
    port_args = PortArgs.init_new(server_args)

    with create_store(model_dir, job["levels"], device="cpu", dtype=kwargs["dtype"]) as store, \
            tempfile.TemporaryDirectory(prefix="tiertp-weights-verify-") as out:
        run_rank_processes(_rank_main, [(server_args, port_args, store.handle, job, r, out) for r in range(tp)],
                           f"TP{tp} weight check", "cpu")
        ranks = [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(tp)]
    return {"tp": tp, "levels": list(job["levels"]), "blocks": store.layout.blocks,
            "store_bytes": store.layout.nbytes, **ranks[0]["outputs"], "ranks": [r["bind"] for r in ranks]}


def _rank_main(server_args, port_args, handle, job: dict, tp_rank: int, out: str) -> None:
    import torch
    from sglang.benchmark import one_batch
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader
    from sglang.srt.runtime_context import SpawnRanks, publish, spawn_world_rank

    from tiertp.weights.bind import parameters_outside
    from tiertp.weights.sglang_llama import loading_from_store
    from tiertp.weights.store import attach

    tp = int(job["tp"])
    publish(server_args, role="scheduler",
            ranks=SpawnRanks(world_rank=spawn_world_rank(server_args, tp_rank=tp_rank, pp_rank=0), gpu_id=tp_rank))
    one_batch._init_process_global_configs()
    store = attach(handle)
    with loading_from_store(store, tp, tp_rank) as loader:
        runner, _ = one_batch.load_model(server_args, port_args, tp_rank, tp_rank)
    model = runner.torch_runner.model
    next_rid = iter(range(1 << 62))

    def generate():
        runner.clear()
        reqs = one_batch.prepare_synthetic_inputs_for_latency_test(len(job["prompts"]), None, job["prompts"])
        for r in reqs:
            r.rid = str(next(next_rid))
        ids, logits, batch = runner.extend(reqs)
        tokens, all_logits = [ids.tolist()], [logits.float().clone()]
        for _ in range(int(job.get("decode_steps", 4))):
            ids, logits = runner.decode(ids, batch)
            tokens.append(ids.tolist())
            all_logits.append(logits.float().clone())
        return [list(t) for t in zip(*tokens)], torch.stack(all_logits)

    stats = loader.stats
    if stats is None:
        raise RuntimeError("the ModelRunner did not load through the store loader")
    total_params = len(dict(model.named_parameters()))
    outside = parameters_outside(model, store)
    with torch.no_grad():
        got_tokens, got_logits = generate()
        normal = DefaultModelLoader(LoadConfig(load_format="auto")).load_model(
            model_config=runner.torch_runner.model_config, device_config=DeviceConfig("cpu", tp_rank))
        runner.torch_runner.model = normal
        ref_tokens, ref_logits = generate()
    reference_in_store = len(dict(normal.named_parameters())) - len(parameters_outside(normal, store))

    diff = (got_logits - ref_logits).abs()
    result = {
        "outputs": {
            "reference_tokens": ref_tokens,
            "store_tokens": got_tokens,
            "max_abs_logit_diff": float(diff.max()),
            "max_abs_logit": float(ref_logits.abs().max()),
        },
        "bind": {**dataclasses.asdict(stats), "model_parameters": total_params,
                 "parameters_outside_store": outside, "reference_parameters_in_store": reference_in_store},
    }
    (Path(out) / f"rank{tp_rank}.json").write_text(json.dumps(result))
    if tp > 1:
        from sglang.srt.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()
        destroy_distributed_environment()
