"""Trace specs as the CLI spells them, resolved to a Trace:

  azure-conv, azure-code             named traces (the public data, $TIERTP_DATA)
  FORMAT:PATH                        a file in a named format (azure:, burstgpt:, mooncake:)
  PATH                               a file, format from extension/header
  synthetic:PROCESS,key=value,...    a generated trace (keys in SYNTHETIC_KEYS)

A file trace is named after its file stem (e.g. `conv`), a synthetic one
`synthetic-PROCESS-RATErps` (e.g. `synthetic-poisson-5rps`); tier maps refer
to traces by these names.
"""

from __future__ import annotations

from pathlib import Path

from tiertp.traces.errors import TraceError
from tiertp.traces.formats import FORMATS, read_file
from tiertp.traces.synthetic import ARRIVALS, LengthDist, SyntheticSpec, generate
from tiertp.traces.trace import Trace

# The one list of named traces: name -> (format, path parts under the data dir).
NAMED_TRACES: dict[str, tuple[str, tuple[str, ...]]] = {
    "azure-conv": ("azure", ("traces", "azure-llm-2023", "conv.csv")),
    "azure-code": ("azure", ("traces", "azure-llm-2023", "code.csv")),
}

SYNTHETIC = "synthetic"
# The one list of synthetic-spec keys -> what each sets (defaults: SyntheticSpec).
SYNTHETIC_KEYS = {
    "rate": "mean arrival rate, req/s",
    "cv": "coefficient of variation of inter-arrival times (poisson: 1)",
    "duration": "seconds of arrivals",
    "prompt": "mean prompt tokens",
    "prompt_cv": "CV of prompt tokens (0: fixed; else lognormal)",
    "output": "mean output tokens",
    "output_cv": "CV of output tokens (0: fixed; else lognormal)",
    "seed": "generator seed",
}


def parse_synthetic(body: str, seed: int = 0) -> SyntheticSpec:
    """`poisson,rate=5,cv=1,prompt=1024,output=128,duration=600` -> spec.
    `seed` is used unless the spec gives its own."""
    parts = [p.strip() for p in body.split(",") if p.strip()]
    if not parts or "=" in parts[0]:
        raise TraceError(f"synthetic trace {body!r}: start with the arrival process, one of {', '.join(ARRIVALS)}")
    process = parts[0]
    if process not in ARRIVALS:
        raise TraceError(f"synthetic trace {body!r}: unknown arrival process {process!r}; valid: {', '.join(ARRIVALS)}")
    values: dict[str, float] = {}
    for part in parts[1:]:
        key, sep, value = part.partition("=")
        if not sep or key not in SYNTHETIC_KEYS:
            raise TraceError(f"synthetic trace {body!r}: unknown key {key!r}; valid keys: {', '.join(SYNTHETIC_KEYS)}")
        try:
            values[key] = float(value)
        except ValueError:
            raise TraceError(f"synthetic trace {body!r}: {key}={value!r} is not a number") from None
    default = SyntheticSpec(process=process)
    return SyntheticSpec(
        process=process,
        rate=values.get("rate", default.rate),
        cv=values.get("cv", 1.0 if process == "poisson" else default.cv),
        duration_s=values.get("duration", default.duration_s),
        prompt=LengthDist(values.get("prompt", default.prompt.mean), values.get("prompt_cv", 0.0)),
        output=LengthDist(values.get("output", default.output.mean), values.get("output_cv", 0.0)),
        seed=int(values.get("seed", seed)),
    )


def load_trace(spec: str, seed: int = 0) -> Trace:
    """The Trace `spec` names (see the module docstring)."""
    if spec in NAMED_TRACES:
        from tiertp.data import data_path

        fmt, parts = NAMED_TRACES[spec]
        return read_file(data_path(*parts), fmt, source=spec)
    prefix, sep, rest = spec.partition(":")
    if sep and prefix == SYNTHETIC:
        return generate(parse_synthetic(rest, seed))
    if sep and prefix in FORMATS:
        return read_file(rest, prefix)
    path = Path(spec)
    if path.suffix and path.is_file():
        return read_file(path)
    raise TraceError(
        f"unknown trace {spec!r}; valid: named traces {', '.join(NAMED_TRACES)}, a trace file "
        f"(optionally prefixed {', '.join(f'{f}:' for f in FORMATS)}), or "
        f"{SYNTHETIC}:PROCESS,key=value,... (processes {', '.join(ARRIVALS)}; keys {', '.join(SYNTHETIC_KEYS)})"
    )
