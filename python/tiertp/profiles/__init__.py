"""TP performance profiles composed from measured GPU kernel latencies.

`resolve(gpu, model)` names a shipped default table (defaults/*.json);
`tiertp profile build-defaults` (build_defaults.py) regenerates them from
the kernel tables in the public data (gpu-kernels/), and `tiertp profile
compose` (from_config.py) composes one the same way for any other
Llama-, Mistral- or Qwen2-shaped model from its config.json.
"""

from tiertp.profiles.registry import DEFAULTS_DIR, resolve, shipped

__all__ = ["DEFAULTS_DIR", "resolve", "shipped"]
