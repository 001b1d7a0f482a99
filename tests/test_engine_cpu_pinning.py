"""A CPU rank runs on its own core group with one thread per core.

Two bugs made `tiertp serve --devices 2` 5-15x slower than its profile:
SGLang pins ranks only with its native CPU kernels, and OMP_NUM_THREADS set
after torch was imported is ignored. These tests pin down both fixes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tiertp.engine import cpu_pinning

pytestmark = pytest.mark.slow


def test_parse_core_group():
    assert cpu_pinning.parse_core_group("1") == [1]
    assert cpu_pinning.parse_core_group("0,1") == [0, 1]
    assert cpu_pinning.parse_core_group("4-6,0") == [0, 4, 5, 6]
    with pytest.raises(ValueError, match="bad core group"):
        cpu_pinning.parse_core_group("a")


def test_rank_cores_indexes_the_bind_string_by_rank():
    assert cpu_pinning.rank_cores(0, "0|1") == [0]
    assert cpu_pinning.rank_cores(1, "0,1|2,3") == [2, 3]
    with pytest.raises(ValueError, match="rank 2 has no core group"):
        cpu_pinning.rank_cores(2, "0|1")


def test_rank_cores_needs_apply_first(monkeypatch):
    monkeypatch.delenv(cpu_pinning.BIND_ENV, raising=False)
    with pytest.raises(RuntimeError, match="apply first"):
        cpu_pinning.rank_cores(0)


def test_apply_sets_torch_threads_even_after_torch_was_imported():
    # The rank processes of an execution process import torch (through the
    # spawned parent's main module) before apply sets OMP_NUM_THREADS.
    code = ("import torch\n"
            "from tiertp.engine import sglang_compat\n"
            "sglang_compat.apply('cpu', 1, cores_per_rank=1)\n"
            "print(torch.get_num_threads())\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"


def rank_binding(handle, _arg):
    """Call target (runs in a rank process): every thread's cores, and torch's thread count."""
    import torch

    cores = {tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir("/proc/self/task")}
    return sorted(cores), torch.get_num_threads()


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and 2 cores")
def test_a_rank_is_pinned_to_its_devices_core():
    from tiertp.execution.instance import TpInstance
    from tiertp.execution.rank_call import RankFunction
    from tiertp.execution.spec import InstanceSpec

    core = sorted(os.sched_getaffinity(0))[1]
    with TpInstance(InstanceSpec("tiny-llama", tp=1, devices=(1,), cores_per_rank=1)) as inst:
        inst.start()
        [(cores, threads)] = inst.call_on_ranks(RankFunction(rank_binding))
    assert cores == [(core,)]  # every thread of the rank, on device 1's core only
    assert threads == 1
