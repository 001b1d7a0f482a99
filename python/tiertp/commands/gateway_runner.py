"""Running the gateway (Rust, in this process) until SIGINT or SIGTERM: the
part `tiertp serve` and `tiertp gateway` share once their agents are up."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from tiertp.commands.banner import banner
from tiertp.commands.gateway_options import GatewaySettings, ServeInputError

if TYPE_CHECKING:
    from tiertp.worker.seal import ControlKey

log = logging.getLogger(__name__)

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stop:
    """Set by SIGINT/SIGTERM; the main thread polls it (`is_set`, `wait`).
    The handler only records the signal and takes no lock: a handler runs
    between two lines of whatever the main thread runs, itself included,
    so a second signal handled inside a first one's `threading.Event.set`
    waited for the lock that set held, and the process never stopped (two
    SIGINTs at once: Ctrl-C to a process group, or `timeout` forwarding
    one)."""

    POLL_S = 0.05

    def __init__(self):
        self.signum: int | None = None

    def _handler(self, signum, _frame) -> None:
        if self.signum is None:
            self.signum = signum

    def is_set(self) -> bool:
        return self.signum is not None

    def wait(self, timeout_s: float) -> bool:
        """Whether a signal came within `timeout_s` (True as soon as one has)."""
        deadline = time.monotonic() + timeout_s
        while self.signum is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, self.POLL_S))
        return True


@contextmanager
def stop_on_signals() -> Iterator[Stop]:
    """A Stop whose handlers stay installed until the block (cleanup
    included) is over; the previous handlers are restored after."""
    stop = Stop()
    old = {s: signal.signal(s, stop._handler) for s in _STOP_SIGNALS}
    try:
        yield stop
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def serve_gateway(prog: str, settings: GatewaySettings, workers: list[tuple[str, int]], key: ControlKey,
                  devices: str, stop: Stop, check: Callable[[], str | None] = lambda: None,
                  connect_timeout_s: float | None = None) -> int:
    """Starts the gateway over `workers` ((agent endpoint, devices) per node,
    holding `key`; each waited for up to `connect_timeout_s`, None: the gateway's default),
    prints the banner (`devices`: what it plans over, in words), serves until
    a signal (0) or until `check` names a reason to stop (1), then shuts the
    gateway down."""
    from tiertp import _scheduler

    try:
        gateway = _scheduler.GatewayServer(
            str(settings.tiers_path), settings.model, str(settings.model_dir), workers, key.raw, host=settings.host,
            port=settings.port, profile_path=settings.profile_path, tp_levels=settings.tp_levels,
            window_s=settings.window, sampling_defaults=settings.sampling_defaults,
            connect_timeout_s=connect_timeout_s)
    except OSError as e:
        raise ServeInputError(str(e)) from None
    try:
        print(banner(prog, gateway.address, settings.model, devices, settings.tp_levels, settings.profile,
                     settings.tiers_path), flush=True)
        while not stop.wait(0.5):
            why = check()
            if why:
                log.error("%s; stopping", why)
                return 1
        log.info("signal %s: shutting down", signal.Signals(stop.signum).name)
        return 0
    finally:
        try:
            gateway.shutdown(5.0)
        except BaseException as e:  # noqa: BLE001 - what the caller started must still be stopped
            log.error("gateway shutdown failed: %s", e)
