"""The README's layout table and map name files that exist.

The map names files relative to a package (`worker/agent.py`, `gateway/app.rs`)
or, after a first mention, by their bare name (`zmq.rs`): each name must be the
end of the path of some file in the repository, so a moved or renamed file
fails here instead of leaving the map wrong.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FILE_NAME = re.compile(r"`([\w./-]+\.(?:py|pyi|rs|cu|cpp|md|toml|sh|txt))`")
# The map's stated shorthand for the Rust crates' source folders.
SHORTHAND = {"gateway/": "rust-scheduler/gateway/src/", "core/": "rust-scheduler/core/src/"}


def _readings(name: str) -> list[str]:
    """The name as written, and expanded when it starts with a shorthand."""
    return [name] + [full + name[len(short):] for short, full in SHORTHAND.items() if name.startswith(short)]


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return out.stdout.splitlines()


def test_every_file_the_readme_names_exists():
    files = _tracked()
    missing = sorted({name for name in FILE_NAME.findall(README)
                      if not any(f == n or f.endswith("/" + n) for f in files for n in _readings(name))})
    assert not missing, f"README names files that are not in the repository: {missing}"


def test_every_path_in_the_layout_table_exists():
    table = README[README.index("## Layout"):README.index("### Map")]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    paths = [p for row in rows for p in re.findall(r"`([^`]+)`", row)]
    assert len(paths) > 10, paths
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"the README's layout table lists paths that do not exist: {missing}"
