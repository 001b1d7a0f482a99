"""Suite-wide pytest hooks."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules marked `slow` run first, each keeping its order.

    `make test` spreads whole modules over two xdist workers in collection
    order (`--dist loadfile --no-loadscope-reorder`). Started last, a slow
    module (minutes of real SGLang processes) would run alone at the end while
    the other worker waits; started first, the many short modules fill in
    behind it.
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
