"""The execution loop admits requests only within the KV pool.

Each admitted request reserves prompt + max_tokens of KV, so a running
batch can never outgrow the pool mid-decode (the runner has no retraction:
a refused decode step would fail the whole batch). FCFS: a request that
does not fit waits at the head, later ones do not overtake it.
"""

import math

import pytest

from tiertp import _scheduler
from tiertp.worker.executor import ExecutionLoop
from tiertp.worker.step_runner import StepRunner


class _Runner(StepRunner):
    """A runner that records the prefill chunks it is given; `chunks` says whether it can chunk."""

    def __init__(self, chunks: bool = True):
        self.chunks, self.chunk_calls = chunks, []

    def start(self):
        raise AssertionError("not started in these tests")

    def step(self, batch):
        raise AssertionError("not stepped in these tests")

    def set_prefill_chunk(self, tokens):
        self.chunk_calls.append(tokens)
        return self.chunks

    def close(self):
        pass


def _add(loop: ExecutionLoop, rid: int, prompt: int, max_tokens: int) -> None:
    loop._handle({"type": "add", "rid": rid, "input_ids": [1] * prompt, "max_tokens": max_tokens,
                  "temperature": 0.0, "top_p": 1.0, "seed": None, "stop_token_ids": [], "cls": "feasible",
                  "deadline": math.inf})


def test_admission_reserves_prompt_plus_max_tokens():
    loop = ExecutionLoop(sock=None, runner=_Runner(), batch_cap=16, token_cap=0, kv_capacity_tokens=100)
    for rid, (prompt, out) in enumerate([(30, 10), (20, 20), (30, 30), (5, 5)]):
        _add(loop, rid, prompt, out)
    first = loop.requests.admit()
    assert first == [0, 1]  # 40 + 40 reserved; request 2 (60) does not fit, 3 may not overtake it
    assert list(loop.requests.running) == [0, 1] and list(loop.requests.waiting) == [2, 3]
    assert loop.requests.admit() == []
    loop.requests.cancel(0)  # request 0 left: 60 free
    admitted = loop.requests.admit()
    assert admitted == [2]
    assert loop.requests.admit() == []  # 40 + 60 = 100 reserved
    loop.requests.cancel(1)
    assert loop.requests.admit() == [3]


def test_batch_policy_next_batch_within_keeps_the_refused_request_first():
    b = _scheduler.BatchPolicy(8, 0)
    for i in range(4):
        b.enqueue(i, "feasible", 10)
    assert b.next_batch_within(0, 25, {0: 10, 1: 10, 2: 10}) == [0, 1]
    assert b.next_batch_within(2, 100, {}) == [2, 3]  # unlisted: its prompt tokens


@pytest.mark.parametrize("chunks", [True, False])
def test_the_token_cap_is_a_prefill_chunk_where_the_runner_chunks(chunks):
    # The simulator reads a plan's token cap as a per-iteration prefill budget
    # and splits longer prompts over iterations; a runner that can chunk does
    # the same, so the policy must then admit a prompt longer than the cap.
    runner = _Runner(chunks)
    loop = ExecutionLoop(sock=None, runner=runner, batch_cap=16, token_cap=32, kv_capacity_tokens=1000)
    for rid in range(3):
        _add(loop, rid, 40, 4)
    assert runner.chunk_calls == [32]
    # Without chunking, a long prompt goes only into an empty batch.
    assert loop.requests.admit() == ([0, 1, 2] if chunks else [0])
    loop._handle({"type": "caps", "batch_cap": 16, "token_cap": 0})
    assert runner.chunk_calls == [32, None]
