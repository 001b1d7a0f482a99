"""`tiertp worker`: the node agent (docs/worker-protocol.md).

Binds a ZeroMQ ROUTER socket, starts one execution process per aligned TP
group at every candidate TP level (SGLang on CPU: N logical devices; with
several levels a device's processes share one weight copy), serves
submit/cancel/apply_plan/stats/ping until SIGINT or SIGTERM (a plan that
changes TP groups is a TP switch), then stops every process it started.

It hears only clients holding its control-plane key (--key-file, required,
on every bind: `tiertp keys FILE` makes one; give the gateway the same file):
anyone else gets no reply at all and is logged.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tiertp.commands.keys import add_key_file_argument
from tiertp.engine.models import EMBEDDED_MODELS
from tiertp.worker.config import AgentConfig

_DEFAULTS = AgentConfig()


def parse_tp_levels(text: str) -> tuple[int, ...]:
    """argparse type of --tp-levels (worker and serve)."""
    try:
        return tuple(int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,2,4, got {text!r}") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("worker", help="run the node agent (execution processes behind a ZeroMQ socket)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bind", default=_DEFAULTS.bind, help=f"ROUTER endpoint (default {_DEFAULTS.bind})")
    p.add_argument("--model", default=_DEFAULTS.model,
                   help=f"embedded model ({', '.join(EMBEDDED_MODELS)}) or an HF model directory "
                        f"(default {_DEFAULTS.model})")
    p.add_argument("--devices", type=int, default=_DEFAULTS.devices, help="logical devices on CPU")
    p.add_argument("--tp-levels", type=parse_tp_levels, default=_DEFAULTS.tp_levels,
                   help="candidate TP levels, e.g. 1,2,4: a warm process per aligned group at each level, "
                        "sharing one weight copy per device; plans switch between them")
    p.add_argument("--max-total-tokens", type=int, default=_DEFAULTS.max_total_tokens,
                   help="KV slots per execution process")
    p.add_argument("--batch-cap", type=int, default=_DEFAULTS.batch_cap, help="requests per iteration until a plan")
    p.add_argument("--cores-per-device", type=int, default=None,
                   help="CPU cores each logical device owns, device d on core group d "
                        "(default: the machine's cores split over the devices)")
    p.add_argument("--log-dir", type=Path, default=None, help="execution process logs (default: a temp dir)")
    add_key_file_argument(
        p, "the control-plane key (required; `tiertp keys FILE` makes one, the gateway is given the "
           "same file): the agent hears only clients holding it")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tiertp.engine.models import resolve_model
    from tiertp.worker.agent import serve
    from tiertp.worker.key_file import require_key_file

    key = require_key_file(args.key_file, "the agent hears only clients holding its control-plane key")
    # Fail here, naming the valid models, rather than in every execution process start.
    resolve_model(args.model)
    cfg = AgentConfig(model=args.model, bind=args.bind, devices=args.devices, tp_levels=args.tp_levels,
                      max_total_tokens=args.max_total_tokens, batch_cap=args.batch_cap, log_dir=args.log_dir,
                      cores_per_device=args.cores_per_device, key=key)
    serve(cfg)
    return 0
