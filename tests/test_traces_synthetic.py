"""Synthetic generator: rate and CV within tolerance, length
distributions, seeded reproducibility, spec parsing."""

from __future__ import annotations

import numpy as np
import pytest

from tiertp.traces import LengthDist, SyntheticSpec, TraceError, generate, load_trace, parse_synthetic


def gaps(trace):
    return np.diff(trace.arrival_s)


@pytest.mark.parametrize("process, cv", [("poisson", 1.0), ("gamma", 0.5), ("gamma", 3.0), ("weibull", 0.5), ("weibull", 2.0)])
def test_rate_and_cv_within_tolerance(process, cv):
    t = generate(SyntheticSpec(process=process, rate=20.0, cv=cv, duration_s=1000.0, seed=1))
    g = gaps(t)
    assert t.arrival_s[0] == 0.0 and t.arrival_s[-1] < 1000.0
    assert 1 / g.mean() == pytest.approx(20.0, rel=0.05)
    assert g.std() / g.mean() == pytest.approx(cv, rel=0.12)


def test_lengths_fixed_and_lognormal():
    t = generate(SyntheticSpec(rate=50, duration_s=400, prompt=LengthDist(1000, 1.0), output=LengthDist(128), seed=3))
    assert set(t.output_tokens.tolist()) == {128}
    assert t.prompt_tokens.mean() == pytest.approx(1000, rel=0.08)
    assert t.prompt_tokens.std() / t.prompt_tokens.mean() == pytest.approx(1.0, rel=0.2)
    assert t.prompt_tokens.min() >= 1


def test_seeded_reproducibility():
    spec = SyntheticSpec(process="gamma", rate=5, cv=2, duration_s=100, prompt=LengthDist(500, 0.5), seed=7)
    a, b = generate(spec), generate(spec)
    for field in ("arrival_s", "prompt_tokens", "output_tokens"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    c = generate(SyntheticSpec(process="gamma", rate=5, cv=2, duration_s=100, prompt=LengthDist(500, 0.5), seed=8))
    assert not np.array_equal(a.arrival_s[:10], c.arrival_s[:10])


def test_spec_string():
    spec = parse_synthetic("weibull,rate=5,cv=2,prompt=1024,prompt_cv=0.5,output=128,duration=600,seed=4")
    assert (spec.process, spec.rate, spec.cv, spec.duration_s, spec.seed) == ("weibull", 5, 2, 600, 4)
    assert spec.prompt == LengthDist(1024, 0.5) and spec.output == LengthDist(128, 0.0)
    t = load_trace("synthetic:poisson,rate=5,cv=1,prompt=1024,output=128,duration=60")
    assert t.source == "synthetic-poisson-5rps" and 150 < len(t) < 450


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("rate=5", "start with the arrival process, one of poisson, gamma, weibull"),
        ("pareto,rate=5", "unknown arrival process 'pareto'"),
        ("gamma,rps=5", "unknown key 'rps'; valid keys: rate, cv, duration"),
        ("gamma,rate=fast", "rate='fast' is not a number"),
    ],
)
def test_bad_specs_list_valid_names(spec, needle):
    with pytest.raises(TraceError, match=needle):
        parse_synthetic(spec)


def test_bad_parameters():
    with pytest.raises(TraceError, match="poisson arrivals have CV 1"):
        generate(SyntheticSpec(process="poisson", cv=2))
    with pytest.raises(TraceError, match="rate must be"):
        generate(SyntheticSpec(rate=0))
    with pytest.raises(TraceError, match="weibull arrivals support CV"):
        generate(SyntheticSpec(process="weibull", cv=1e6))
