"""Choosing a TP performance profile: a file, a shipped default table by
(GPU, model) name, or the analytic synthetic profile."""

from __future__ import annotations

import argparse

from tiertp import _scheduler

SYNTHETIC = "synthetic"
# `tiertp serve`'s default: this machine's profile, measured once and cached.
MEASURED = "measured"


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("profile (one of)")
    g.add_argument("--profile", help=f"profile JSON file, or '{SYNTHETIC}' for the analytic model")
    g.add_argument("--gpu", help="shipped default table: GPU (e.g. h100)")
    g.add_argument("--model", help="shipped default table: model (e.g. llama-3.1-8b)")


def load_profile(args: argparse.Namespace, default_gpu: str | None = None, default_model: str | None = None) -> _scheduler.Profile:
    """The profile the arguments name; shipped tables via tiertp.profiles."""
    if args.profile and (args.gpu or args.model):
        raise ValueError("give --profile or --gpu/--model, not both")
    if args.profile == SYNTHETIC:
        return _scheduler.Profile.synthetic()
    if args.profile:
        return _scheduler.Profile.load(args.profile)
    gpu = args.gpu or default_gpu
    model = args.model or default_model
    if not (gpu and model):
        raise ValueError("name a profile: --profile FILE, or --gpu and --model for a shipped table")
    from tiertp.profiles import resolve

    return _scheduler.Profile.load(str(resolve(gpu, model)))
