"""The processes a soak runs and kills: node agents (`tiertp worker`, each on
its own TCP port, restartable there) and one `tiertp gateway` over them,
all holding one control-plane key."""

from __future__ import annotations

import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from tiertp.engine.isolated import kill_group, stop_group
from tiertp.ports import free_port
from tiertp.worker.key_file import load_key_file
from tiertp.worker.stats_query import StatsUnanswered, ask_stats

_URL = re.compile(r"OpenAI API at (http://\S+)")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tiertp.cli", *args]


class Node:
    """One node: `tiertp worker` on its own port; `crash` kills it and its
    execution processes at once (a machine that goes away), `start` brings
    it back on the same port."""

    def __init__(self, work: Path, name: str, model: str, devices: int, tp_levels: str, key_file: Path):
        self.work, self.name, self.model, self.devices, self.tp_levels = work, name, model, devices, tp_levels
        self.key_file, self.key = key_file, load_key_file(key_file)
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.starts = 0
        self.popen: subprocess.Popen | None = None
        self.log_dir: Path | None = None

    def start(self) -> None:
        self.starts += 1
        run = self.work / f"{self.name}-{self.starts}"
        run.mkdir(parents=True)
        self.log_dir = run / "logs"
        with open(run / "agent.log", "wb") as log:
            self.popen = subprocess.Popen(
                _cli("worker", "--bind", self.endpoint, "--model", self.model, "--devices", str(self.devices),
                     "--tp-levels", self.tp_levels, "--log-dir", str(self.log_dir), "--key-file", str(self.key_file)),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def ready(self) -> bool:
        try:
            stats = ask_stats(self.endpoint, self.key, timeout_s=1.0)
        except StatsUnanswered:
            return False
        return all(d.get("state", "ready") == "ready" for d in stats["devices"])

    def executors(self) -> list[psutil.Process]:
        """Its execution processes (each in a session of its own)."""
        if self.log_dir is None:
            return []
        return [p for p in psutil.process_iter(["cmdline"]) if str(self.log_dir) in " ".join(p.info["cmdline"] or [])]

    def kill_executor(self, rng: random.Random) -> str | None:
        """SIGKILL one of its execution processes; what was killed, or None."""
        procs = self.executors()
        if not procs:
            return None
        p = rng.choice(procs)
        try:
            p.kill()
        except psutil.NoSuchProcess:
            return None
        return f"{self.name} execution process {p.pid}"

    def crash(self) -> None:
        """SIGKILL the agent and everything it started, with no goodbye."""
        if self.popen is not None:
            try:
                self.popen.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
            kill_group(self.popen, grace_s=1.0)
        for p in self.executors():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass

    def stop(self) -> None:
        if self.popen is not None:
            stop_group(self.popen, grace_s=1.0)
        self.crash()


class Gateway:
    """`tiertp gateway` over the nodes; `url` once its banner is out."""

    def __init__(self, work: Path, nodes: list[Node], model: str, tiers: Path, tp_levels: str, key_file: Path,
                 window_s: float):
        workers = [a for n in nodes for a in ("--worker", f"{n.endpoint}={n.devices}")]
        self.log_path = work / "gateway.log"
        self._log = open(self.log_path, "wb")
        self.popen = subprocess.Popen(
            _cli("gateway", "--model", model, "--tiers", str(tiers), "--tp-levels", tp_levels, "--port", "0",
                 "--window", str(window_s), "--key-file", str(key_file), *workers),
            stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL, start_new_session=True, text=True)
        self.url: str | None = None

    def wait_url(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.popen.stdout.readline()
            if not line:
                break
            m = _URL.search(line)
            if m:
                self.url = m.group(1)
                # Keep reading, so a full pipe never blocks the gateway.
                threading.Thread(target=self.popen.stdout.read, daemon=True).start()
                return self.url
        raise RuntimeError(f"tiertp gateway did not come up within {timeout_s:g} s; its log: {self.log_path}")

    def stop(self) -> None:
        stop_group(self.popen, signal.SIGINT, grace_s=1.0)
        self._log.close()
