"""Small process helpers shared by the execution processes."""

from __future__ import annotations

import ctypes
import signal


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies, even
    by SIGKILL (PR_SET_PDEATHSIG). No-op where prctl is missing (not Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)
    except OSError:
        pass


def set_title(title: str) -> None:
    """Name this process in ps/top (SGLang's dependency setproctitle), if available."""
    try:  # optional: SGLang's dependency, not ours
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(title)
