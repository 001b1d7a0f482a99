"""The agent's handle on one execution process (tiertp.worker.process),
with a stand-in child instead of an engine."""

from __future__ import annotations

import subprocess
import sys

import zmq

from tiertp.tp_group import TpGroup
from tiertp.worker import process as process_module
from tiertp.worker.config import AgentConfig
from tiertp.worker.process import DEAD, READY, ExecProcess


def test_a_message_to_a_process_whose_socket_end_is_gone_never_blocks_the_agent(monkeypatch, tmp_path):
    """A PAIR socket without its peer blocks a plain send for ever: the
    agent's loop (and its SIGTERM) would hang on a keepalive ping to a
    process that died just after the liveness check. The send returns, and
    the next check reports the process dead and ends it."""
    real_popen = subprocess.Popen

    def child(cmd, **kw):  # a process that never connects, in its own session like the executor
        return real_popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True,
                          stdin=subprocess.DEVNULL)

    monkeypatch.setattr(process_module.subprocess, "Popen", child)
    ctx = zmq.Context()
    try:
        proc = ExecProcess(ctx, AgentConfig(log_dir=tmp_path), TpGroup(0, 1), generation=1, batch_cap=8, token_cap=0)
        proc.state = READY  # as if its `ready` had arrived; nothing reads its socket
        proc.send({"type": "ping"})  # returns: the assertion is that we get here
        reason = proc.check()
        assert reason is not None and f"pid {proc.pid} took no message" in reason, reason
        assert proc.state == DEAD
        assert proc.popen.wait(timeout=30) is not None  # ended (its group killed)
        assert proc.check() is None  # reported once
    finally:
        ctx.term()
