"""Errors of the execution instance: one base class, one subclass per failure.

Two kinds, and the difference matters to callers: a *rejected* command
(`CommandRejected` and its subclasses) was checked by the leader before any
rank ran anything, so the instance is unchanged and still usable; an
`InstanceFailed` means a rank process died or raised mid-command, the
instance has been torn down and must be restarted.
"""

from __future__ import annotations


class ExecutionError(Exception):
    """Base of every execution-instance failure."""


class CommandRejected(ExecutionError, ValueError):
    """The leader refused a command before running it; nothing changed."""


class UnknownRequest(CommandRejected):
    """A command named a request id this instance does not hold."""


class DuplicateRequest(CommandRejected):
    """A command tried to add a request id this instance already holds."""


class KVOutOfSpace(CommandRejected):
    """Fewer free KV slots (or request rows) than the command needs.

    Raised before anything is allocated or overwritten, so a caller (an
    import, an admission) may retry later or elsewhere.
    """

    def __init__(self, what: str, needed: int, free: int):
        super().__init__(f"{what}: needs {needed} free KV slots, the pool has {free}")
        self.what, self.needed, self.free = what, needed, free

    def __reduce__(self):  # crosses the leader's pipe: rebuild from the fields, not the message
        return (type(self), (self.what, self.needed, self.free))


class InstanceFailed(ExecutionError, RuntimeError):
    """A rank process died, hung or raised while running a command.

    The instance is closed (every rank process killed) when this is raised.
    """
