"""The gateway's options, shared by `tiertp serve` (the gateway and an agent
on this machine) and `tiertp gateway` (the gateway alone, agents on other
machines), and their checks: a bad value is a one-line error before anything
starts. Each command checks its TP levels against its own devices first."""

from __future__ import annotations

import argparse
import socket
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from tiertp._scheduler import DEFAULT_GATEWAY_HOST, DEFAULT_GATEWAY_PORT, SAMPLING_DEFAULTS
from tiertp.commands.worker import parse_tp_levels
from tiertp.defaults import DEFAULT_TIERS
from tiertp.engine.models import EMBEDDED_MODELS
from tiertp.number_types import positive_float
from tiertp.profile_source import MEASURED, SYNTHETIC
from tiertp.worker.config import AgentConfig, check_model_fits_tp_levels

DEFAULT_MODEL = "smollm2-135m"


class ServeInputError(ValueError):
    """Bad input to serve or gateway, printed by the CLI as one line (exit
    code 2). A ValueError rather than tiertp.cli.UserError: under `python -m
    tiertp.cli` the CLI module runs as __main__ and catches its own copy of
    UserError, not the one imported here; both copies of the CLI catch
    ValueError."""


def add_gateway_options(p: argparse.ArgumentParser, model_help: str, tp_levels_help: str,
                        profile_default: str = SYNTHETIC, profile_help: str = "") -> None:
    """--model, --tp-levels, --tiers, --profile, --window, --sampling-defaults, --host, --port."""
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"embedded model ({', '.join(EMBEDDED_MODELS)}) or an HF model directory{model_help} "
                        f"(default {DEFAULT_MODEL})")
    p.add_argument("--tp-levels", type=parse_tp_levels, default=AgentConfig().tp_levels, help=tp_levels_help)
    p.add_argument("--tiers", type=Path, default=None,
                   help="tier TOML (names, SLOs, weights, api_keys, max_concurrent_requests, "
                        "max_requests_per_minute; default: the embedded tiers)")
    p.add_argument("--profile", default=profile_default,
                   help=f"TP performance profile JSON the planner uses (e.g. written by `tiertp profile`), "
                        f"or '{SYNTHETIC}' for the analytic model{profile_help} (default: {profile_default})")
    p.add_argument("--window", type=positive_float, default=None, metavar="S",
                   help="control window in seconds, 0.25-5: the planner runs and worker health is polled this "
                        "often (default: the gateway's)")
    p.add_argument("--sampling-defaults", choices=SAMPLING_DEFAULTS, default="model",
                   help="temperature and top_p for requests that omit them: 'model' takes the model's "
                        "generation_config.json (as SGLang and vLLM do; OpenAI's 1.0 where it gives none), "
                        "'openai' always takes OpenAI's API defaults (temperature 1.0, top_p 1.0) "
                        "(default: %(default)s)")
    p.add_argument("--host", default=DEFAULT_GATEWAY_HOST, help="HTTP address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=DEFAULT_GATEWAY_PORT, help="HTTP port (0: a free one; default %(default)s)")


@dataclass(frozen=True)
class GatewaySettings:
    """The checked options: what `GatewayServer` is started with."""

    tiers_path: Path
    model: str  # the name clients ask for
    model_dir: Path  # the tokenizer and the generation config
    tp_levels: list[int]
    profile: str  # as given: a file, SYNTHETIC or MEASURED
    profile_path: str | None  # None: the synthetic profile (MEASURED: until serve has measured it)
    host: str
    port: int
    window: float | None
    sampling_defaults: str


def gateway_settings(args: argparse.Namespace) -> GatewaySettings:
    """The options checked (the tier file, the profile against the TP levels,
    the port, the model and its heads against the TP levels)."""
    from tiertp import _scheduler
    from tiertp.engine.models import model_name, resolve_model

    tiers_path = args.tiers or DEFAULT_TIERS
    if not Path(tiers_path).is_file():
        raise ServeInputError(f"--tiers {tiers_path}: no such file")
    _scheduler.TierSet.load(str(tiers_path))  # TierConfigError (a ValueError) names the problem
    tp_levels = sorted(set(args.tp_levels))
    profile_path = _check_profile(args.profile, tp_levels)
    _check_port(args.host, args.port)
    model_dir = resolve_model(args.model)  # ModelError lists the embedded models
    try:
        check_model_fits_tp_levels(args.model, tuple(tp_levels))
    except ValueError as e:
        raise ServeInputError(str(e)) from None
    return GatewaySettings(tiers_path=Path(tiers_path), model=model_name(args.model), model_dir=model_dir,
                           tp_levels=tp_levels, profile=args.profile, profile_path=profile_path, host=args.host,
                           port=args.port, window=args.window, sampling_defaults=args.sampling_defaults)


def _check_port(host: str, port: int) -> None:
    if not 0 <= port <= 65535:
        raise ServeInputError(f"--port {port}: must be in 0..65535")
    if port == 0:
        return
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise ServeInputError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def _check_profile(profile: str, tp_levels: list[int]) -> str | None:
    """The profile file for the gateway (None: the synthetic profile), checked
    now so that a bad file is a one-line error before anything starts."""
    from tiertp import _scheduler

    if profile in (SYNTHETIC, MEASURED):
        return None
    if not Path(profile).is_file():
        raise ServeInputError(f"--profile {profile}: no such file")
    try:
        loaded = _scheduler.Profile.load(profile)
    except ValueError as e:
        raise ServeInputError(f"--profile {profile}: {e}") from None
    missing = sorted(set(tp_levels) - set(loaded.tp_levels))
    if missing:
        raise ServeInputError(f"--profile {profile}: no table for TP level(s) {missing}; the workers run TP "
                              f"{tp_levels} (the profile has {loaded.tp_levels})")
    return profile
