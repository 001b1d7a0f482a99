"""Build SGLang's ModelRunner for one rank (runs inside a rank process).

The path is SGLang's own `sglang.benchmark.one_batch.load_model` (what
`tiertp profile` measures, so profiles time exactly these forwards):
distributed init for the instance's TP group (gloo on CPU), the model with
its TP shards, the KV pools (`req_to_token_pool`, `token_to_kv_pool` and its
allocator) and the attention backend; CUDA graphs on CUDA. The weight store
hooks in through `InstanceSpec.weight_binder` (see tiertp.execution).
"""

from __future__ import annotations

from types import SimpleNamespace

from tiertp.engine import sglang_compat
from tiertp.execution.context import TpContext
from tiertp.execution.spec import InstanceSpec


def load_rank(spec: InstanceSpec, model_path: str, rank: int, dist_port: int):
    """(model_runner, tokenizer, TpContext) for `rank`; the first thing a rank process does.

    Must run before anything in the process imports sglang (it applies
    tiertp.engine.sglang_compat first), unless the process was forked from
    the CPU ranks' forkserver (tiertp.engine.rank_preload).
    """
    if spec.device == "cuda":
        sglang_compat.check_cuda_available()
    # With a fixed core count per rank, pin by device: instances on different
    # devices never share cores (tiertp.engine.sglang_compat.cpu_threads_bind).
    sglang_compat.apply(spec.device, spec.tp, spec.cores_per_rank,
                        spec.devices if spec.cores_per_rank else None)
    # SGLang only now: sglang_compat.apply must run before its first import.
    from sglang.benchmark import one_batch
    from sglang.srt.runtime_context import SpawnRanks, publish, spawn_world_rank
    from sglang.srt.server_args import ServerArgs

    kwargs = sglang_compat.engine_kwargs(spec.device, spec.tp, max_total_tokens=spec.max_total_tokens)
    kwargs.pop("skip_server_warmup")  # a server option; no server here
    if spec.weight_binder is not None:
        kwargs["load_format"] = "dummy"  # the binder provides the weights
    kwargs.update(spec.extra_server_args)
    server_args = ServerArgs(model_path=model_path, **kwargs)
    server_args.resolve_once()
    # On CPU SGLang picks the rank's core group from SGLANG_CPU_OMP_THREADS_BIND
    # by gpu_id, which indexes that list; on CUDA it is the device.
    gpu_id = spec.devices[rank] if spec.device == "cuda" else rank
    # As one_batch.latency_test: a new rank arrives with nothing published.
    publish(server_args, role="scheduler",
            ranks=SpawnRanks(world_rank=spawn_world_rank(server_args, tp_rank=rank, pp_rank=0), gpu_id=gpu_id))
    one_batch._init_process_global_configs()
    if spec.device == "cpu":
        from tiertp.engine import cpu_attention  # imports SGLang

        cpu_attention.install()
    # load_model reads only `nccl_port` of the port args: the instance's
    # torch.distributed rendezvous port, chosen by the controller.
    bench, tokenizer = one_batch.load_model(server_args, SimpleNamespace(nccl_port=dist_port), gpu_id, rank)
    runner = bench.torch_runner
    group = None
    if spec.tp > 1:
        from sglang.srt.distributed.parallel_state import get_tp_group

        group = get_tp_group()
    ctx = TpContext(tp=spec.tp, rank=rank, device=spec.devices[rank], device_kind=spec.device, group=group)
    if spec.weight_binder is not None:
        spec.weight_binder(runner, ctx, spec.weight_binder_arg)
    return runner, tokenizer, ctx
