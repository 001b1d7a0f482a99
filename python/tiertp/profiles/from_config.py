"""Compose a TP profile for a model the shipped tables do not cover, from its
Hugging Face config.json and measured GPU kernel latencies
(<data>/gpu-kernels/<gpu>/), the way `build-defaults` composes the shipped
ones: at every TP level the model fits at on that GPU, checked by the
planner's profile loader. Any Llama-, Mistral- or Qwen2-shaped model with
128-dimensional heads composes; give the file to any command as
`--profile FILE`.

e.g. tiertp profile compose --config Qwen2.5-7B-Instruct/config.json --gpu h100 --out qwen2.5-7b-h100.json
     tiertp replay --trace azure-conv --profile qwen2.5-7b-h100.json --gpus 4 --policies all
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
from pathlib import Path

from tiertp.data import data_dir
from tiertp.json_file import read_json_object
from tiertp.profiles.build_defaults import build_profile, load_tables, loader_complaint, write_profile
from tiertp.profiles.gpus import GPUS, get_gpu
from tiertp.profiles.models import ModelShape

log = logging.getLogger(__name__)

GENERATOR = "tiertp profile compose (tiertp.profiles.from_config)"


def read_model_config(path: Path) -> tuple[dict, Path]:
    """The config as a dict and the file it came from: `path` itself, or
    the config.json of the model directory `path`."""
    return read_json_object(path, "config.json", "a config.json", "give a model's config.json or its directory")


def model_name(cfg: dict, file: Path) -> str:
    """What the profile calls the model: the last part of the config's
    `_name_or_path`, else the name of the folder it sits in."""
    named = str(cfg.get("_name_or_path") or "").rstrip("/").rsplit("/", 1)[-1]
    return (named or file.resolve().parent.name).lower()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, required=True, help="the model's config.json, or its directory")
    parser.add_argument("--gpu", required=True, help=f"GPU whose kernel latencies to compose ({', '.join(GPUS)})")
    parser.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    parser.add_argument("--name", help="the profile's model name (default: from the config's _name_or_path, else its folder)")
    parser.add_argument("--data", type=Path, help="public data folder holding gpu-kernels/ (default: $TIERTP_DATA or ../shared/data)")
    parser.add_argument("--date", default=None, help="date recorded as provenance.generated (default: today, UTC)")


def compose(config: Path, gpu_name: str, out: Path, *, name: str | None = None, data: Path | None = None,
            date: str | None = None) -> tuple[dict, str | None]:
    """Compose the profile of the model `config` describes on `gpu_name` and
    write it to `out`; the profile and the planner's loader's complaint
    about it (None when it loads)."""
    gpu = get_gpu(gpu_name)
    cfg, file = read_model_config(config)
    name = name or model_name(cfg, file)
    generated = date or dt.datetime.now(dt.timezone.utc).date().isoformat()
    tables = load_tables(data if data else data_dir(), gpu)
    try:
        model = ModelShape.from_config(cfg, name=name, hf_id=str(cfg.get("_name_or_path") or name))
        profile = build_profile(gpu, model, tables, generated, GENERATOR)
    except ValueError as e:
        raise ValueError(f"{file}: {e}") from None
    write_profile(profile, out)
    return profile, loader_complaint(out)


def run(args: argparse.Namespace) -> int:
    profile, problem = compose(args.config, args.gpu, args.out, name=args.name, data=args.data, date=args.date)
    if problem:
        log.error("profile loader rejects: %s", problem)
        return 1
    print(f"wrote {args.out}: {profile['model']} on {get_gpu(args.gpu).name}, TP {','.join(profile['tp_levels'])}")
    return 0
