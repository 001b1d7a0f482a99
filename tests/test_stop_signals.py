"""`tiertp serve` and `tiertp gateway` stop on SIGINT/SIGTERM however the
signals arrive: a handler runs between two lines of whatever the main
thread runs, a first handler included."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from tiertp.commands.gateway_runner import Stop, stop_on_signals


def test_a_signal_handled_inside_another_ones_handler_does_not_block():
    # A second signal between any two lines of the first one's handler
    # (and of anything it calls), as when two SIGINTs arrive at once.
    stop = Stop()
    nested = threading.local()

    def tracer(frame, event, arg):
        if event == "line" and not getattr(nested, "busy", False):
            nested.busy = True
            try:
                stop._handler(signal.SIGTERM, None)
            finally:
                nested.busy = False
        return tracer

    def first():
        sys.settrace(tracer)
        try:
            stop._handler(signal.SIGINT, None)
        finally:
            sys.settrace(None)

    t = threading.Thread(target=first, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "the handler blocked on a second signal"
    assert stop.is_set()
    assert stop.signum in (signal.SIGINT, signal.SIGTERM)


def test_wait_returns_when_a_signal_comes_and_times_out_without_one():
    # What the process started with: Python's KeyboardInterrupt handler, or
    # SIG_IGN when it was started in the background by a non-interactive shell.
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with stop_on_signals() as stop:
        t0 = time.monotonic()
        assert stop.wait(0.1) is False
        assert time.monotonic() - t0 >= 0.1
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        assert stop.wait(10.0) is True
        assert time.monotonic() - t0 < 5.0
        assert stop.is_set() and stop.signum == signal.SIGINT
    # The previous handlers are back.
    assert {s: signal.getsignal(s) for s in before} == before
