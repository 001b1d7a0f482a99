"""Run a function in its own process group, for code that starts SGLang engines.

Why: when one of SGLang's child processes fails, SGLang kills the whole
process tree including the process that created the engine; and engines
must be created under ``if __name__ == "__main__"`` because SGLang spawns.
So callers (tests, `tiertp profile`) never start an engine in their own
process: they call `run_isolated(function, payload)`, which runs
``python -m tiertp.engine.isolated`` in a new session, passes `payload`
(JSON) to the function, and returns its JSON result.

Contract:
- the function is a module-level one (the child imports it by its module
  and name), takes one dict and returns a JSON-serialisable value;
- when the call returns, raises, or times out, every process in the child's
  process group has been killed (no orphans), SGLang's included;
- a failure raises `IsolatedRunError` carrying the tail of the child's log.

Inside such a child, `tiertp.engine.rank_processes.run_rank_processes`
starts one process per TP rank and waits for them all.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import tiertp

_LOG_TAIL_CHARS = 4000


class IsolatedRunError(RuntimeError):
    """The isolated function failed, was killed, or timed out."""

    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(f"{message}\n--- last lines of the child's output ---\n{log_tail}" if log_tail else message)
        self.log_tail = log_tail


def run_isolated(
    target: Callable[[dict], object],
    payload: dict,
    *,
    timeout_s: float,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    poll: Callable[[], None] | None = None,
    poll_interval_s: float = 0.5,
):
    """Run `target` (a module-level function) on `payload` in a fresh process group.

    The child's stdout and stderr go to `log_path` (a temporary file if None).
    `env` adds to the inherited environment. `poll`, if given, is called
    about every `poll_interval_s` while the child runs (e.g. to update a
    progress bar from files the child writes).
    """
    name = _importable_name(target)
    with tempfile.TemporaryDirectory(prefix="tiertp-isolated-") as tmp:
        tmp = Path(tmp)
        (tmp / "payload.json").write_text(json.dumps({"target": name, "payload": payload}))
        log = Path(log_path) if log_path else tmp / "child.log"
        child_env = {**os.environ, **(env or {})}
        # The child must import tiertp from where this process did (a source
        # checkout or site-packages).
        pkg_root = str(Path(tiertp.__file__).resolve().parents[1])
        child_env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, child_env.get("PYTHONPATH", "")) if p)
        with open(log, "ab") as logf:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tiertp.engine.isolated", str(tmp)],
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=child_env,
                start_new_session=True,  # its own process group: killed as one
            )
            try:
                rc = _wait(proc, timeout_s, poll, poll_interval_s)
            except subprocess.TimeoutExpired:
                kill_group(proc)
                raise IsolatedRunError(f"{name} timed out after {timeout_s:.0f} s", _tail(log)) from None
            except BaseException:  # KeyboardInterrupt included: never leave engines behind
                kill_group(proc)
                raise
            kill_group(proc)  # SGLang's helpers may outlive a returned main process
        result = tmp / "result.json"
        if rc != 0 or not result.is_file():
            raise IsolatedRunError(f"{name} failed (exit code {rc})", _tail(log))
        return json.loads(result.read_text())["result"]


def _importable_name(fn: Callable) -> str:
    """"module:function" by which the child imports `fn`; ValueError for a
    function it could not import (a lambda, a nested or bound function)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not callable(fn) or not module or not qualname.isidentifier():
        raise ValueError(f"run_isolated needs a module-level function, got {fn!r}")
    if module == "__main__":
        # A script's function: the child imports the script as a module
        # (its folder must be on the child's PYTHONPATH).
        main = sys.modules["__main__"]
        spec = getattr(main, "__spec__", None)
        module = spec.name if spec is not None else Path(main.__file__).stem
    return f"{module}:{qualname}"


def _wait(proc: subprocess.Popen, timeout_s: float, poll, interval_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
        try:
            return proc.wait(timeout=min(left, interval_s) if poll else left)
        except subprocess.TimeoutExpired:
            if poll:
                poll()


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM, wait_s: float = 30.0, grace_s: float = 5.0) -> None:
    """Ask the child to stop (`sig`), wait up to `wait_s` for it, then
    `kill_group` whatever is left of its process group."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            pass
    kill_group(proc, grace_s)


def kill_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM the child's process group, then SIGKILL whatever is left."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = proc.pid  # leader gone; its group may still have members
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader: until then its zombie keeps the group alive to killpg
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            continue
        break
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass


def _tail(log: Path) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    return text[-_LOG_TAIL_CHARS:]


def _main(workdir: str) -> int:
    work = Path(workdir)
    spec = json.loads((work / "payload.json").read_text())
    module, _, func = spec["target"].partition(":")
    fn = getattr(importlib.import_module(module), func)
    result = fn(spec["payload"])
    tmp = work / "result.json.tmp"
    tmp.write_text(json.dumps({"result": result}))
    tmp.rename(work / "result.json")
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: SGLang's atexit hooks and lingering threads
    # can hang it; the parent kills the group anyway.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
