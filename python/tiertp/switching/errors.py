"""Errors of TP switching / hand-off: one base class, one subclass per outcome."""

from __future__ import annotations


class SwitchError(Exception):
    """Base of every switch / hand-off failure."""


class SwitchRolledBack(SwitchError):
    """The switch did not complete and was undone: the destination freed the
    KV slots it had allocated for it and holds none of the moved requests;
    every source still holds its requests and is back in its previous pause
    state. `cause` is what failed (e.g. a MigrationAborted message: the
    destination was out of KV space). `lost_sources` names sources whose
    rank died meanwhile (their requests are gone with them: the caller fails
    them back); empty in the usual case."""

    def __init__(self, cause: str, lost_sources: tuple[int, ...] = ()):
        lost = f"; source(s) {list(lost_sources)} died and lost their requests" if lost_sources else ""
        super().__init__(f"switch rolled back: {cause}{lost}")
        self.cause, self.lost_sources = cause, lost_sources

    @property
    def out_of_space(self) -> bool:
        return "free KV pages" in self.cause or "free KV slots" in self.cause

    def __reduce__(self):
        return (type(self), (self.cause, self.lost_sources))


class SwitchSetupError(SwitchError, ValueError):
    """The switch was asked for something impossible (instances of different
    models, a destination that is also a source, ...); nothing was touched."""
