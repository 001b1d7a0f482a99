"""Page and slot id lists as int64 tensors, fast.

torch.tensor() on a list or tuple of Python ints converts it object by
object (about 0.2 us each: 7 ms for 32K slots); packing it into an
array('q') first and wrapping that buffer costs a tenth of it. Migrations
and adopts handle tens of thousands of ids per request batch.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import torch


def id_tensor(ids: Sequence[int], device: torch.device | str | None = None) -> torch.Tensor:
    """A 1-D int64 tensor of `ids` (on `device`, default CPU), owning its memory."""
    if len(ids) == 0:
        out = torch.empty(0, dtype=torch.long)
    else:
        # frombuffer shares the array's memory; the tensor keeps the array alive.
        out = torch.frombuffer(array("q", ids), dtype=torch.long)
    return out if device is None else out.to(device)
