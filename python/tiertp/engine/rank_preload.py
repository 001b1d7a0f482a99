"""What a CPU rank imports before it loads its model, imported once per
process that starts ranks, by the forkserver that forks its CPU ranks
(tiertp.engine.rank_processes says why). Nothing here depends on an
instance: each rank still applies its TP size, cores and devices
(tiertp.execution.loader).
"""

from __future__ import annotations

import importlib

try:  # SGLang's dependency, not ours
    import setproctitle

    # Set up while the environment is untouched: it moves the environment
    # out of the command line's memory on first use, and once imports have
    # changed the environment it can no longer find that memory and a rank's
    # title (tiertp::tp{N}_rank{R}, what ps and the tests look for) never
    # shows. The ranks forked from here inherit the setup.
    setproctitle.getproctitle()
except ImportError:
    pass

from tiertp.engine import sglang_compat  # noqa: E402

# What the ranks import (tiertp.execution.loader, the rank functions of
# tiertp.profiling.measure and tiertp.weights.verify), and the model class of the embedded
# models (Llama); SGLang imports other architectures at load time.
_MODULES = (
    "sglang.benchmark.one_batch",
    "sglang.srt.runtime_context",
    "sglang.srt.server_args",
    "sglang.srt.distributed.parallel_state",
    "sglang.srt.models.llama",
)

sglang_compat.prepare_cpu_import()
for _name in _MODULES:
    importlib.import_module(_name)
