"""`tiertp keys`: a new control-plane key file (owner-only, never printed,
never overwritten unless --force), the checks on loading one, and
`tiertp worker` refusing to start without one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tiertp.worker.key_file import KeyFileError, load_key_file, write_key_file

pytestmark = pytest.mark.slow


def tiertp(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tiertp.cli", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_keys_writes_an_owner_only_key_prints_the_path_not_the_key_and_keeps_an_existing_one(tmp_path: Path):
    path = tmp_path / "control.key"
    r = tiertp("keys", str(path))
    assert r.returncode == 0, r.stderr
    text = path.read_text()
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert len(text) == 65 and text.endswith("\n") and int(text, 16) >= 0
    assert str(path) in r.stdout and text.strip() not in r.stdout + r.stderr
    assert load_key_file(path).raw.hex() == text.strip()

    r = tiertp("keys", str(path))
    assert r.returncode == 2 and "exists; not overwritten (--force" in r.stderr
    assert path.read_text() == text
    r = tiertp("keys", "--force", str(path))
    assert r.returncode == 0 and path.read_text() != text and os.stat(path).st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["control.key"]  # no temporary file left behind


@pytest.mark.parametrize("mode, content, needle", [
    (0o640, None, "group or others may access it (mode 0640)"),
    (0o604, None, "chmod 600"),
    (0o600, "00" * 31 + "\n", "expected 64 hex digits and a newline"),
    (0o600, "zz" * 32 + "\n", "expected 64 hex digits"),
    (0o600, "ab" * 32 + "\n\n", "expected 64 hex digits"),
])
def test_a_key_file_open_to_others_or_not_a_key_is_refused_naming_it(tmp_path: Path, mode, content, needle):
    path = tmp_path / "control.key"
    write_key_file(path)
    secret = path.read_text().strip()
    if content is not None:
        path.write_text(content)
    path.chmod(mode)
    with pytest.raises(KeyFileError) as e:
        load_key_file(path)
    assert str(path) in str(e.value) and needle in str(e.value), e.value
    assert secret not in str(e.value) and (content is None or content.strip() not in str(e.value))


def test_a_missing_key_file_names_the_command_that_makes_one(tmp_path: Path):
    with pytest.raises(KeyFileError, match="No such file.*tiertp keys"):
        load_key_file(tmp_path / "none.key")


def test_the_worker_refuses_to_start_without_a_usable_key(tmp_path: Path):
    r = tiertp("worker", "--bind", "tcp://0.0.0.0:0")
    assert r.returncode == 2 and "--key-file is required" in r.stderr and "tiertp keys FILE" in r.stderr, r.stderr
    path = tmp_path / "control.key"
    write_key_file(path)
    path.chmod(0o644)
    r = tiertp("worker", "--key-file", str(path))
    assert r.returncode == 2 and f"{path}: group or others may access it" in r.stderr, r.stderr
