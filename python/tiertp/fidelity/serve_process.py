"""`tiertp serve` as a subprocess of a fidelity run: started on a free port,
ready when it prints its URL, stopped with SIGINT (its own clean shutdown),
killed only if that does not end it."""

from __future__ import annotations

import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tiertp.worker.key_file import load_key_file, write_key_file
from tiertp.worker.seal import ControlKey

log = logging.getLogger(__name__)

_URL = re.compile(r"OpenAI API at (http://\S+)")




class ServeProcess:
    """A running `tiertp serve --devices N --model M --tiers T --port 0`."""

    def __init__(self, model: str, devices: int, tiers_path: Path, log_dir: Path, ready_timeout_s: float = 600.0,
                 cpus: list[int] | None = None, profile: Path | str | None = None, window_s: float | None = None,
                 tp_levels: list[int] | None = None, worker_port: int | None = None):
        """`cpus`: run serve and everything it starts on these cores only (the
        engines size their thread pools from this affinity mask). `profile` /
        `window_s` / `tp_levels`: what the gateway plans with — the simulator's,
        so both sides run the same planner on the same inputs (None: serve's
        defaults). `worker_port`: the agent's ZeroMQ port (`agent_endpoint`),
        for asking the agent what it did (its `stats`), with the key written
        to `log_dir` for it (`agent_key`); None: serve picks the port and its key."""
        self.log_dir = log_dir
        self.ready_timeout_s = ready_timeout_s
        log_dir.mkdir(parents=True, exist_ok=True)
        self.cmd = [sys.executable, "-m", "tiertp.cli", "serve", "--model", model, "--devices", str(devices),
                    "--tiers", str(tiers_path), "--port", "0", "--log-dir", str(log_dir / "engines"),
                    "--ready-timeout", str(ready_timeout_s)]
        if profile is not None:
            self.cmd += ["--profile", str(profile)]
        if window_s is not None:
            self.cmd += ["--window", str(window_s)]
        if tp_levels is not None:
            self.cmd += ["--tp-levels", ",".join(str(t) for t in tp_levels)]
        self.agent_endpoint: str | None = None
        self.agent_key: ControlKey | None = None
        if worker_port is not None:
            key_file = log_dir / "control.key"
            write_key_file(key_file, force=True)
            self.cmd += ["--worker-port", str(worker_port), "--key-file", str(key_file)]
            self.agent_endpoint = f"tcp://127.0.0.1:{worker_port}"
            self.agent_key = load_key_file(key_file)
        self.output_path = log_dir / "serve.log"
        self._out = open(self.output_path, "w")
        log.info("starting: %s%s", " ".join(self.cmd), f" on cores {cpus}" if cpus else "")
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        self.popen = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, text=True, start_new_session=True, preexec_fn=pin)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._pump_thread = threading.Thread(target=self._pump, name="serve-output", daemon=True)
        self._pump_thread.start()
        self.url: str | None = None

    def _pump(self) -> None:
        for line in self.popen.stdout:
            self._out.write(line)
            self._out.flush()
            self._lines.put(line)
        self._lines.put(None)

    def wait_url(self) -> str:
        """The served URL once the gateway is up; RuntimeError if serve exits or times out."""
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=1.0)
            except queue.Empty:
                continue
            if line is None:
                break
            m = _URL.search(line)
            if m:
                self.url = m.group(1)
                return self.url
        code = self.popen.poll()
        tail = self.output_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"tiertp serve did not come up ({'exit code ' + str(code) if code is not None else 'timed out'});"
                           f" its output ({self.output_path}):\n{tail}")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout_s: float = 90.0) -> int | None:
        """SIGINT and wait; SIGKILL to its process group if it does not stop."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("tiertp serve did not stop in %.0f s; killing it", timeout_s)
                try:
                    os.killpg(self.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait(timeout=30)
        self._pump_thread.join(timeout=10)
        if not self._pump_thread.is_alive():
            self._out.close()
        return self.popen.returncode

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
