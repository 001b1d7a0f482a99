"""The import contracts of .importlinter (run by `make lint`): the package as
it is keeps them all; a copy of it with one deliberate violation breaks the
contract that forbids it, and the output names the offending import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / ".importlinter"
ACYCLIC = "No import cycles between sibling packages or modules, at any depth of tiertp"
LAYERS = "The layers of tiertp: a package imports only from the layers below it"
KERNELS = "KV kernels: implementations over the interface, never over each other or the selection"


def _lint(python_root: Path) -> subprocess.CompletedProcess:
    """lint-imports with the repo's contracts on the `tiertp` under python_root."""
    env = {**os.environ, "PYTHONPATH": str(python_root), "COLUMNS": "400"}  # no wrapped lines to match
    return subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                           "sys.exit(lint_imports_command())", "--no-logo", "--no-cache", str(CONFIG)],
                          cwd=python_root, env=env, capture_output=True, text=True, timeout=60)


def test_the_package_keeps_every_contract():
    run = _lint(REPO / "python")
    assert run.returncode == 0, run.stdout + run.stderr
    for name in (ACYCLIC, LAYERS, KERNELS):
        assert f"{name} KEPT" in run.stdout


# (file under tiertp/ to append to, what to append, contracts it breaks, what the output must name)
VIOLATIONS = {
    # kv sits below worker; a function-local import counts like a top-level one
    "upward import": ("kv/layout.py", "def _deliberate():\n    import tiertp.worker.agent\n", [LAYERS, ACYCLIC],
                      ["tiertp.kv.layout -> tiertp.worker.agent", "No cycles are allowed in tiertp."]),
    # the interface importing the selection that imports its implementations: the old kernels.py cycle
    "cycle": ("kv/kernels/base.py", "import tiertp.kv.kernels.selection\n",
              [ACYCLIC, KERNELS], ["No cycles are allowed in tiertp.kv.kernels.", ".base -> .selection",
                                   "tiertp.kv.kernels.base -> tiertp.kv.kernels.selection"]),
}


@pytest.mark.parametrize("kind", sorted(VIOLATIONS))
def test_a_deliberate_violation_breaks_its_contract(kind, tmp_path):
    path, code, broken, named = VIOLATIONS[kind]
    shutil.copytree(REPO / "python" / "tiertp", tmp_path / "tiertp",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    with open(tmp_path / "tiertp" / path, "a") as f:
        f.write("\n\n" + code)
    run = _lint(tmp_path)
    assert run.returncode != 0, run.stdout + run.stderr
    for name in broken:
        assert f"{name} BROKEN" in run.stdout, run.stdout
    for text in named:
        assert text in run.stdout, run.stdout
