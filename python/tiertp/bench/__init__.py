"""Benchmarks behind `tiertp bench NAME --json`.

BENCHES is the one list: name -> module under tiertp.bench exposing
`add_arguments(parser)` and `run(args) -> dict` (the JSON figures).
"""

BENCHES = {
    "scheduler": "tiertp.bench.scheduler",
    "kv-migration": "tiertp.bench.kv_migration",
    "kv-kernels": "tiertp.bench.kv_kernels",
    "replay": "tiertp.bench.replay",
    "gateway": "tiertp.bench.gateway",
    "switch": "tiertp.bench.switch",
    "soak": "tiertp.bench.soak",
}
