"""`tiertp serve` end to end with the official OpenAI SDK: a real serve
subprocess (agent + SGLang on CPU + gateway) on free ports, started once per
module; at the end SIGINT must stop it and every process it started."""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
KEY = "sk-tiertp-chat"
START_TIMEOUT_S = 300
STOP_TIMEOUT_S = 60


class Serve:
    """`tiertp serve` on free ports (the model and 1 device unless `args` say
    otherwise); also used by the other tests/test_serve_*.py modules.
    `command`: another subcommand with its own options instead of serve's
    (e.g. `tiertp gateway`, tests/test_serve_multinode.py)."""

    def __init__(self, tmp: Path, args: tuple[str, ...] = (), command: tuple[str, ...] | None = None):
        self.log_dir = tmp / "logs"
        # The analytic profile: measuring this machine's (serve's default) is
        # tests/test_machine_profile.py's subject, and a minute per serve here.
        command = command or ("serve", "--devices", "1", "--profile", "synthetic", "--log-dir", str(self.log_dir))
        self.prog = f"tiertp {command[0]}"
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "tiertp.cli", *command, "--model", MODEL, "--port", "0",
             "--ready-timeout", str(START_TIMEOUT_S), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
            start_new_session=True)
        self.lines: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.descendants: list[psutil.Process] = []

    def _pump(self) -> None:
        for line in self.popen.stdout:
            self.lines.append(line)
            self._q.put(line)
        self._q.put(None)

    def output(self) -> str:
        text = "".join(self.lines)[-4000:]
        for f in sorted(self.log_dir.glob("*.log")):
            text += f"\n--- {f.name} ---\n" + f.read_text(errors="replace")[-2000:]
        return text

    def wait_url(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                line = self._q.get(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                break
            m = re.search(r"OpenAI API at (http://\S+)", line)
            if m:
                return m.group(1)
        pytest.fail(f"{self.prog} did not come up (exit {self.popen.poll()}):\n{self.output()}")

    def snapshot(self) -> None:
        self.descendants = psutil.Process(self.popen.pid).children(recursive=True)

    def alive(self) -> list[psutil.Process]:
        procs = []
        for p in self.descendants:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    procs.append(p)
            except psutil.Error:
                pass
        marker = str(self.log_dir)
        for p in psutil.process_iter(["cmdline"]):
            try:
                if marker in " ".join(p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
                    procs.append(p)
            except psutil.Error:
                pass
        return procs

    def kill_everything(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        for p in self.alive():
            try:
                p.kill()
            except psutil.Error:
                pass
        self.popen.wait(timeout=10)

    def stop_cleanly(self) -> None:
        """SIGINT; it must exit 0 and leave no process behind."""
        self.popen.send_signal(signal.SIGINT)
        try:
            rc = self.popen.wait(timeout=STOP_TIMEOUT_S)
            deadline = time.monotonic() + 20
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.5)
            left = self.alive()
        finally:
            self.kill_everything()
        assert rc == 0, f"{self.prog} exited with {rc}:\n{self.output()}"
        assert not left, f"left running after SIGINT: {[p.pid for p in left]}"
        assert f"{self.prog}: stopped" in "".join(self.lines)


def started(tmp: Path, args: tuple[str, ...] = ()):
    """A generator for module fixtures: a ready serve, stopped cleanly after."""
    s = Serve(tmp, args)
    try:
        s.url = s.wait_url()
        s.snapshot()
        assert any("tiertp.cli worker" in " ".join(p.cmdline()) for p in s.descendants)
    except BaseException:
        s.kill_everything()
        raise
    yield s
    s.stop_cleanly()


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    yield from started(tmp_path_factory.mktemp("serve"))


@pytest.fixture
def client(serve):
    return openai.OpenAI(base_url=serve.url, api_key=KEY, max_retries=0, timeout=60)


def test_models(client):
    assert [m.id for m in client.models.list()] == [MODEL]


def test_completion(client):
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0)
    assert r.object == "text_completion" and r.model == MODEL
    assert len(r.choices) == 1 and isinstance(r.choices[0].text, str)
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage is not None and r.usage.prompt_tokens > 0
    assert 0 < r.usage.completion_tokens <= 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello."}],
                                       max_tokens=4, temperature=0)
    assert r.object == "chat.completion"
    msg = r.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str)
    assert r.usage is not None and r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 4


def test_chat_streaming(client):
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Count."}],
                                            max_tokens=4, temperature=0, stream=True)
    chunks = list(stream)
    assert chunks and all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(text, str)


def test_completion_streaming(client):
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=3, stream=True))
    assert chunks and chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_invalid_key(serve):
    bad = openai.OpenAI(base_url=serve.url, api_key="sk-not-a-key", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    assert e.value.status_code == 401


def test_malformed_body(client, serve):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="hi", extra_body={"max_tokens": "x"})
    assert e.value.status_code == 400 and "max_tokens" in str(e.value)
    r = httpx.post(f"{serve.url}/chat/completions", content=b"{not json", timeout=30,
                   headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()


def test_unknown_model(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=2)
    assert e.value.status_code == 404


def test_banner_shows_how_to_call_it(serve):
    deadline = time.monotonic() + 30
    while "press Ctrl-C to stop" not in "".join(serve.lines) and time.monotonic() < deadline:
        time.sleep(0.1)
    out = "".join(serve.lines)
    assert "tier chat" in out and "key sk-tiertp-chat" in out
    assert f"curl {serve.url}/chat/completions" in out
    assert "Authorization: Bearer sk-tiertp-chat" in out
    assert f'OpenAI(base_url="{serve.url}", api_key="sk-tiertp-chat")' in out
