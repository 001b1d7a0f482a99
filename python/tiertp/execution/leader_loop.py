"""Rank 0's loop: commands from the controller in, one operation per command out.

Each command (from tiertp.execution.instance.TpInstance, over a pipe) is
checked and planned by tiertp.execution.leader.Leader, broadcast to the
followers, applied here, and answered. Replies: ("ready", InstanceInfo)
once, then per command ("ok", value), ("rejected", CommandRejected) when it
was refused with nothing changed, or ("call_failed", {rank: message}) when a
`Call` target raised on some rank. `park` / `unpark` reach the
followers as `Call`s of tiertp.execution.rank_kv's targets (after the
leader's checks they cannot fail: one that does ends the rank, as a failed
forward would). `set_prefill_chunk` changes only the
leader's planning (no operation reaches the followers). An exception
anywhere else (a forward that raised: the ranks may disagree from here on)
ends the rank process, which first sends ("failed", message).
"""

from __future__ import annotations

from tiertp.execution import ops
from tiertp.execution.rank import RankHandle, apply, broadcast, gather
from tiertp.execution.spec import InstanceSpec


class LeaderLoop:
    """Rank 0's command loop over the controller's pipe."""

    def __init__(self, conn, handle: RankHandle, tokenizer, spec: InstanceSpec):
        from tiertp.execution.kv_view import geometry_of
        from tiertp.execution.leader import Leader
        from tiertp.execution.records import InstanceInfo

        self.conn, self.handle, self.ctx = conn, handle, handle.ctx
        runner = handle.model_runner
        cfg = runner.model_config
        eos = set(cfg.hf_eos_token_id or ())
        if getattr(tokenizer, "eos_token_id", None) is not None:
            eos.add(int(tokenizer.eos_token_id))
        self.info = InstanceInfo(
            tp=spec.tp, vocab_size=int(cfg.vocab_size), context_len=int(cfg.context_len),
            kv_capacity_tokens=int(runner.max_total_num_tokens),
            max_running_requests=int(handle.kv.req_to_token_pool.size),
            eos_token_ids=tuple(sorted(eos)), kv=geometry_of(handle))
        self.leader = Leader(handle.kv, self.info.vocab_size, self.info.eos_token_ids, spec.prefill_chunk_tokens)

    def run(self) -> None:
        import torch

        from tiertp.execution.errors import CommandRejected

        self.conn.send(("ready", self.info))
        with torch.no_grad():
            while True:
                try:
                    kind, payload = self.conn.recv()
                except EOFError:  # the controller is gone: stop the followers, nobody to answer
                    kind, payload = "gone", None
                if kind in ("shutdown", "gone"):
                    if self.ctx.group is not None:
                        broadcast(self.ctx, ops.Shutdown())
                    if kind == "shutdown":
                        self.conn.send(("ok", None))
                    return
                try:
                    reply = getattr(self, f"_cmd_{kind}")(payload)
                except CommandRejected as e:
                    reply = ("rejected", e)
                self.conn.send(reply)

    def _run(self, op):
        """Broadcast `op`, apply it here; the leader's own result."""
        if self.ctx.group is not None:
            broadcast(self.ctx, op)
        return apply(self.handle, op)

    def _cmd_iterate(self, payload):
        admit, release = payload
        plan = self.leader.plan_iteration(admit, release)
        decode_logits, extended = self._run(plan)
        # Requests that finished their extend joined the running batch after the decode, at its end.
        decoding = self.handle.kv.running[: len(plan.decode_tokens)]
        self.leader.book_admitted(plan, admit)
        out = []
        if decode_logits is not None:
            out += self.leader.sample(decoding, decode_logits)
        if extended is not None:
            logits, finished = extended
            out += self.leader.sample(finished, logits)
        return ("ok", out)

    def _cmd_release(self, rids):
        op = self.leader.plan_release(rids)
        self._run(op)
        self.leader.book_released(rids)
        return ("ok", None)

    def _cmd_export(self, rids):
        return ("ok", self.leader.export(rids))

    def _cmd_reserve(self, counts):
        return ("ok", self._run(self.leader.plan_reserve(counts)))

    def _cmd_free(self, slots):
        self._run(self.leader.plan_free(slots))
        return ("ok", None)

    def _cmd_adopt(self, states):
        op = self.leader.plan_adopt(states)
        self._run(op)
        self.leader.book_adopted(states)
        return ("ok", None)

    def _cmd_park(self, rids):
        """Export and park in one command (one round trip for a hand-off)."""
        from tiertp.execution.rank_kv import PARK

        states = self.leader.plan_park(rids)
        self._run_everywhere(PARK, list(rids))
        return ("ok", states)

    def _cmd_unpark(self, rids):
        from tiertp.execution.rank_kv import UNPARK

        self._run_everywhere(UNPARK, self.leader.plan_unpark(rids))
        return ("ok", None)

    def _run_everywhere(self, target: str, arg) -> None:
        """Run a checked state change on every rank; raising (the ranks may now disagree) ends the rank."""
        results = gather(self.ctx, self._run(ops.Call(target, arg)))
        errors = [f"rank {r}: {res[1]}" for r, res in enumerate(results) if res[0] == "error"]
        if errors:
            raise RuntimeError(f"{target} failed after the leader's checks: {'; '.join(errors)}")

    def _cmd_call(self, payload):
        target, arg = payload
        mine = self._run(ops.Call(target, arg))
        results = gather(self.ctx, mine)
        errors = {r: res[1] for r, res in enumerate(results) if res[0] == "error"}
        if errors:
            return ("call_failed", errors)
        return ("ok", [res[1] for res in results])

    def _cmd_set_prefill_chunk(self, tokens):
        self.leader.set_chunk(tokens)
        return ("ok", None)

    def _cmd_stats(self, _):
        from tiertp.execution.records import InstanceStats

        kv = self.handle.kv
        free = kv.free_slots()
        return ("ok", InstanceStats(running=len(kv.running), pending=len(kv.pending),
                                    kv_used_slots=self.info.kv_capacity_tokens - free, kv_free_slots=free,
                                    reserved_slots=kv.reserved_count()))
