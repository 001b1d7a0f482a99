"""Simulator fidelity: the same trace simulated (with a profile measured on
this machine) and replayed live against `tiertp serve`, predicted vs
measured goodput, SLO attainment and latency percentiles per tier.

Modules: defaults (the shipped CPU tiers, the gateway's window), sim_profile
(what the simulator is told about the live workers), serve_process (`tiertp
serve` as a subprocess), compare (predicted vs measured), experiment (the
command end to end). Kept import-light: the CLI reads the defaults.
"""
