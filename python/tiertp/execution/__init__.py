"""The KV-owning execution instance on SGLang's model runner.

A `TpInstance` is one model replica at TP level k: k rank processes, each
holding SGLang's `ModelRunner` at TP k (CPU: gloo, torch_native attention,
no CUDA graphs; CUDA: NCCL and CUDA graphs, SGLang's defaults), and the paged
KV of the requests it runs. The controller (whoever created the TpInstance:
the execution process, a test, a switch coordinator) never imports SGLang.

Processes and roles
-------------------
- rank 0, the *leader*, gets one command (tiertp.execution.commands) at a
  time over a pipe, checks it, plans it (tiertp.execution.leader),
  broadcasts the resulting operation (tiertp.execution.ops) to the followers
  over the instance's gloo group, applies it itself (tiertp.execution.apply),
  samples, and answers. Followers apply what they
  receive and never decide anything, so every rank runs the same forwards.
- the TP context (`TpContext`: tp, rank, device, SGLang's group) is passed
  explicitly to everything in a rank; nothing in tiertp reads a global.
- a refused command (`CommandRejected`: unknown/duplicate request,
  `KVOutOfSpace`, bad slots) changes nothing and the instance stays usable;
  a rank that dies or raises mid-command ends the instance (`InstanceFailed`,
  every rank killed).

Per iteration (`iterate(admit, release)`)
-----------------------------------------
release first (their KV freed), then DECODE the running batch (every
running request: continuous batching, membership controlled by admit and
release), then EXTEND pending requests in admission order within
`InstanceSpec.prefill_chunk_tokens` (chunked prefill) and the free KV;
requests whose prefill completes join the running batch. Returns one
`TokenOut` per request that produced a token. Sampling (greedy, or
temperature/top_p with a per-request seed that gives the same tokens
whatever the batch, TP level or migration) is the leader's.

KV ownership (`tiertp.execution.rank_kv.RankKV`, one per rank): SGLang's
`req_to_token_pool` (request row -> slots) and `token_to_kv_pool` (per-layer
`k_buffer`/`v_buffer` of shape [slots, kv_heads_per_rank, head_dim], exactly
what tiertp.kv.KVPool wraps) with its allocator, page size 1 (a page is a
slot). All ranks allocate identically, so a request's slot list is the same
on every rank of the instance.

API (tiertp.execution.instance.TpInstance)
------------------------------------------
start() -> InstanceInfo            vocab, context length, KV capacity, EOS ids, KVGeometry
iterate(admit, release)            one iteration (refused while paused)
release(rids)                      free requests' KV now
pause() / resume() / paused        between two commands the ranks sit at an
                                   iteration boundary with quiescent KV, so
                                   pause only makes iterate refuse; nothing
                                   waits or drains
export(rids) -> [RequestState]     token ids, prompt_len, kv_len, KV slots,
                                   sampling; changes nothing
reserve_slots(counts)              allocate slots for imports, all or nothing
                                   (KVOutOfSpace before anything is allocated)
free_slots(slots)                  give up reserved slots (an import rolled back)
adopt([RequestState])              requests whose first kv_len tokens of KV
                                   someone wrote into reserved `slots`
                                   continue from there: no prefill, same
                                   tokens and sampling; kv_len == 0 is a
                                   waiting request moved as metadata only
call_on_ranks(call)                run a RankCall (tiertp.execution.rank_call) on
begin_call(...).result()           every rank, results in rank order;
                                   begin_call does not wait, so calls that
                                   are collective over several instances (a
                                   migration) can run on all of them at once
read_kv(slots) / write_kv(...)     per-rank copies through the controller
                                   (tests, small hand-offs)
stats(), close(), pids

How the weight store plugs in
-----------------------------
`InstanceSpec.weight_binder` (a module-level function) and
`weight_binder_arg`: in every rank, after SGLang built the model (with
``load_format="dummy"``, so no weight file is read) and before the first
forward, tiertp calls ``weight_binder(model_runner, tp_context,
weight_binder_arg)``; the model is
``model_runner.model``, its TP-sharded parameters are SGLang's (fused
qkv_proj / gate_up_proj), and the binder replaces their storage with views
of the shared full copy (tiertp.execution.loader).

How TP switching / prefill->decode hand-off plugs in
----------------------------------------------------
1. pause the source (and the destination if it is running);
2. `export` the source's requests: a RequestState is what tiertp.kv needs
   per request (``RequestKV(rid, pages=state.slots, context_len=state.kv_len,
   ...)``, page size 1);
3. run tiertp.kv.migrate inside the ranks of both instances with
   `begin_call` on each (one call per instance, then `.result()` on each):
   `RankHandle.kv_pool()` is the rank's KV as a tiertp.kv.KVPool (views of
   SGLang's buffers; heads as SGLang splits them, tiertp.execution.kv_view),
   whose allocator is SGLang's, so the handshake's allocations on the
   destination are reserved slots, returned in MigrationResult.pages;
4. `adopt` the states with the destination's slots on the destination,
   `release` them on the source, resume. On failure: `free_slots` on the
   destination; the source was only read, so resuming it is the rollback.
The same-TP seam (export -> reserve -> write_kv -> adopt) is what
tests/test_execution_kv.py checks.

The execution process runs on an instance through
tiertp.worker.instance_runner.InstanceStepRunner (the default StepRunner,
tiertp.worker.runners). `tests/compare_runners.py` times a decode step
against the SGLang Engine runner.

Not done yet: retraction when a running batch outgrows the KV pool (the
iteration is refused; the caller must release), pages larger than one slot,
mixed prefill+decode forwards (an iteration with both runs two forwards),
and on CPU every instance binds its ranks over all the cores it may use
(not per logical device).
"""
