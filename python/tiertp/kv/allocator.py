"""Free-page bookkeeping of one KV pool."""

from __future__ import annotations

from tiertp.kv.errors import KVMigrationError, OutOfKVSpace


class PageAllocator:
    """Hands out page ids 1..num_pages; page 0 is reserved, as SGLang reserves
    its first page for padded (dummy) tokens.

    Allocation is all-or-nothing: `alloc` either returns `n` pages or raises
    OutOfKVSpace and changes nothing. Lowest ids first, so ranks of one TP
    group that allocate the same sequence of requests get identical pages.
    """

    def __init__(self, num_pages: int, gpu: int = -1):
        self.num_pages = num_pages
        self.gpu = gpu
        self._free = list(range(num_pages, 0, -1))  # a stack: pop() gives the lowest id
        self._used: set[int] = set()

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfKVSpace(self.gpu, n, len(self._free))
        pages = [self._free.pop() for _ in range(n)]
        self._used.update(pages)
        return pages

    def take(self, pages: list[int]) -> None:
        """Mark specific pages used (a pool filled by someone else, e.g. a test)."""
        bad = [p for p in pages if p in self._used or not 1 <= p <= self.num_pages]
        if bad:
            raise KVMigrationError(f"pages {bad[:8]} already used or out of range")
        wanted = set(pages)
        self._free = [p for p in self._free if p not in wanted]
        self._used |= wanted

    def free(self, pages: list[int]) -> None:
        bad = [p for p in pages if p not in self._used]
        if bad:
            raise KVMigrationError(f"freeing pages {bad[:8]} that are not allocated")
        self._used.difference_update(pages)
        self._free.extend(sorted(pages, reverse=True))
        self._free.sort(reverse=True)
