"""Errors of the KV migration area: one base class, one subclass per failure."""

from __future__ import annotations


class KVMigrationError(Exception):
    """Base of every KV migration failure."""


class LayoutError(KVMigrationError, ValueError):
    """A TP layout or request description that cannot be migrated."""


class OutOfKVSpace(KVMigrationError):
    """A KV pool has fewer free pages than a migration needs."""

    def __init__(self, gpu: int, needed: int, free: int):
        super().__init__(f"GPU {gpu}: migration needs {needed} free KV pages, pool has {free}")
        self.gpu, self.needed, self.free = gpu, needed, free


class MigrationAborted(KVMigrationError):
    """The handshake failed on some participant; no KV byte was moved.

    `reasons` maps each failed GPU to its error message. Every participant
    raises this, so the whole group agrees the old layout is still current.
    """

    def __init__(self, reasons: dict[int, str]):
        detail = "; ".join(f"GPU {g}: {r}" for g, r in sorted(reasons.items()))
        super().__init__(f"KV migration aborted, old layout kept ({detail})")
        self.reasons = reasons


class NoGPUError(KVMigrationError, RuntimeError):
    """The CUDA kernels were asked for on a machine without a usable GPU."""
