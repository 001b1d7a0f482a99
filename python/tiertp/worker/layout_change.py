"""What a plan's TP-group changes mean for the requests: merges and splits.

TP groups are aligned power-of-two ranges (tiertp.tp_group), so any two
groups either nest or are disjoint. The groups a plan removes and adds
therefore fall into independent parts, each under one largest group: when
that group is new, the old groups inside it merge into it (TP1 + TP1 -> TP2);
when it is old, it splits into the new groups inside it (TP4 -> TP2 + TP1 +
TP1). Every part is one `LayoutChange`; undoing one is applying its
`reversed()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiertp.tp_group import TpGroup


@dataclass(frozen=True)
class LayoutChange:
    """Requests on `sources` move to `dests`: several sources and one
    destination (a merge) or one source and several destinations (a split)."""

    sources: tuple[TpGroup, ...]
    dests: tuple[TpGroup, ...]

    def reversed(self) -> LayoutChange:
        return LayoutChange(self.dests, self.sources)

    def describe(self) -> str:
        def names(gs):
            return " + ".join(f"TP{g.tp}{list(g.devices)}" for g in gs)

        return f"{names(self.sources)} -> {names(self.dests)}"


def contains(outer: TpGroup, inner: TpGroup) -> bool:
    return outer.first <= inner.first and inner.first + inner.tp <= outer.first + outer.tp


def layout_changes(old: set[TpGroup], new: set[TpGroup]) -> list[LayoutChange]:
    """The parts that turn the active groups `old` into `new` (both partitions
    of the same devices into aligned groups), in device order."""
    removed, added = old - new, new - old
    changed = removed | added
    out = []
    for top in sorted(changed):
        if any(g != top and contains(g, top) for g in changed):
            continue  # inside a larger changed group: part of that one's change
        if top in added:
            out.append(LayoutChange(tuple(sorted(g for g in removed if contains(top, g))), (top,)))
        else:
            out.append(LayoutChange((top,), tuple(sorted(g for g in added if contains(top, g)))))
    return out
