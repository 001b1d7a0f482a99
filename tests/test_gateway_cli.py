"""`tiertp gateway` refuses bad input with an error naming it before it waits
for any agent (a malformed --worker, a bad cluster file, an agent listed
twice, a TP level larger than every node, no usable control-plane key),
waits a bounded time for an agent (naming each one's state when none is
ready), and refuses an agent whose device count is not the one it was given.
The gateway serving real agents, one lost and back:
tests/test_serve_multinode.py."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import zmq

from tiertp.commands.cluster_spec import WorkerEntry, cluster_workers, load_cluster
from tiertp.worker import protocol as P
from tiertp.worker.gate import Gate
from tiertp.worker.key_file import load_key_file, write_key_file

pytestmark = pytest.mark.slow

TIMEOUT_S = 120


@pytest.fixture(scope="module")
def key_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("key") / "control.key"
    write_key_file(path)
    return path


def gateway(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tiertp.cli", "gateway", "--port", "0", "--model", "tiny-llama",
                           *args], capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)


def refused(r: subprocess.CompletedProcess, *needles: str, waited: bool = False) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr[r.stderr.find("tiertp gateway: error: "):]
    assert err, r.stderr
    for n in needles:
        assert n in err, err
    assert ("waiting up to" in r.stderr) == waited, r.stderr


@pytest.mark.parametrize("spec, needle", [
    ("tcp://10.0.0.2:7100", "expected tcp://HOST:PORT=DEVICES"),
    ("tcp://10.0.0.2:7100=four", "DEVICES must be an integer, got 'four'"),
    ("tcp://10.0.0.2:7100=0", "devices must be an integer from 1 to 8"),
    ("tcp://10.0.0.2:7100=9", "devices must be an integer from 1 to 8"),
    ("10.0.0.2:7100=1", "is not tcp://HOST:PORT"),
    ("ipc:///tmp/agent.sock=1", "is not tcp://HOST:PORT"),
    ("tcp://10.0.0.2:70000=1", "port 70000 is not in 1..65535"),
])
def test_malformed_worker(spec: str, needle: str):
    refused(gateway("--worker", spec), "--worker", needle)


def test_no_agents_an_agent_twice_and_a_tp_level_no_node_has(key_file: Path):
    key = ("--key-file", str(key_file))
    refused(gateway(*key), "no agents: give --worker")
    refused(gateway(*key, "--worker", "tcp://127.0.0.1:7100=1", "--worker", "tcp://127.0.0.1:7100=2"),
            "agent tcp://127.0.0.1:7100 is listed twice")
    refused(gateway(*key, "--worker", "tcp://127.0.0.1:7100=1", "--worker", "tcp://127.0.0.1:7101=2", "--tp-levels",
                    "1,2,4"), "--tp-levels 4: no node has that many devices", "tcp://127.0.0.1:7101, has 2")


def test_no_key_file_or_an_unusable_one_is_refused_naming_the_file(tmp_path: Path):
    refused(gateway("--worker", "tcp://127.0.0.1:7100=1"), "--key-file is required", "tiertp keys FILE")
    path = tmp_path / "control.key"
    refused(gateway("--worker", "tcp://127.0.0.1:7100=1", "--key-file", str(path)), f"{path}: No such file")
    write_key_file(path)
    path.chmod(0o644)
    refused(gateway("--worker", "tcp://127.0.0.1:7100=1", "--key-file", str(path)), f"{path}: group or others",
            "chmod 600")


@pytest.mark.parametrize("text, needle", [
    ("[[worker]\n", "not valid TOML"),
    ("", "no [[worker]] tables"),
    ("worker = 3\n", "no [[worker]] tables"),
    ("[gateway]\nport = 1\n", "unknown key(s) ['gateway']"),
    ('[[worker]]\nendpoint = "tcp://a:1"\n', "[[worker]] 1: missing devices"),
    ('[[worker]]\nendpoint = "tcp://a:1"\ndevices = 1\ngpus = 2\n', "[[worker]] 1: unknown key 'gpus'"),
    ('[[worker]]\nendpoint = "tcp://a:1"\ndevices = 1\n[[worker]]\nendpoint = 7\ndevices = 1\n',
     "[[worker]] 2: endpoint must be a string"),
    ('[[worker]]\nendpoint = "http://a:1"\ndevices = 1\n', "[[worker]] 1: endpoint 'http://a:1' is not tcp://"),
    ('[[worker]]\nendpoint = "tcp://a:1"\ndevices = true\n', "devices must be an integer from 1 to 8"),
    ('[[worker]]\nendpoint = "tcp://a:1"\ndevices = 1.5\n', "devices must be an integer from 1 to 8"),
])
def test_bad_cluster_file(tmp_path: Path, text: str, needle: str):
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    with pytest.raises(ValueError) as e:
        load_cluster(path)
    assert f"--cluster {path}" in str(e.value) and needle in str(e.value), e.value


def test_cluster_file_nodes_come_first_then_the_worker_options(tmp_path: Path, key_file: Path):
    path = tmp_path / "cluster.toml"
    path.write_text('[[worker]]\nendpoint = "tcp://node-a:7100"\ndevices = 4\n\n'
                    '[[worker]]\nendpoint = "tcp://[fd00::2]:7100"\ndevices = 2\n')
    extra = WorkerEntry("tcp://10.0.0.3:7100", 1)
    assert cluster_workers(path, [extra]) == [WorkerEntry("tcp://node-a:7100", 4),
                                             WorkerEntry("tcp://[fd00::2]:7100", 2), extra]
    key = ("--key-file", str(key_file))
    refused(gateway(*key, "--cluster", str(tmp_path / "missing.toml")), "no such file")
    refused(gateway(*key, "--cluster", str(path), "--worker", "tcp://node-a:7100=4"),
            "tcp://node-a:7100 is listed twice")


def test_no_agent_ready_in_time_names_each_agent(key_file: Path):
    r = gateway("--key-file", str(key_file), "--worker", "tcp://127.0.0.1:1=1", "--worker", "tcp://127.0.0.1:2=1",
                "--ready-timeout", "1")
    refused(r, "no agent had a device ready within 1 s (--ready-timeout)", "tcp://127.0.0.1:1 (not answering",
            "tcp://127.0.0.1:2 (not answering", waited=True)


class FakeAgent:
    """A ROUTER socket that answers `stats` with `devices` ready devices, to
    clients holding the key in `key_file` (through the agent's own gate)."""

    def __init__(self, devices: int, key_file: Path):
        self.gate = Gate(load_key_file(key_file))
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.devices = devices
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            if not self.sock.poll(100):
                continue
            peer, *frames = self.sock.recv_multipart()
            payload = self.gate.open(peer, frames, "a test client")
            if payload is not None and P.decode(payload)["type"] == P.STATS:
                devices = [{"device": d, "role": "colocated", "tier": None, "tp_group": [d, 1], "running": 0,
                            "waiting": 0, "kv_used_tokens": 0, "kv_capacity_tokens": 64, "state": "ready"}
                           for d in range(self.devices)]
                reply = self.gate.seal(peer, P.encode({"type": P.STATS, "devices": devices, "plan_id": None}))
                self.sock.send_multipart([peer, reply])

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close(0)
        self.ctx.term()


def test_an_agent_with_another_device_count_is_refused(key_file: Path):
    agent = FakeAgent(devices=2, key_file=key_file)
    try:
        r = gateway("--key-file", str(key_file), "--worker", f"{agent.endpoint}=1", "--ready-timeout", "60")
    finally:
        agent.close()
    refused(r, f"agent {agent.endpoint} runs 2 device(s), not the 1 it is given", waited=True)
