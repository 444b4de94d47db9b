"""``seq2seq-plan``: compile a run for an accelerator this machine lacks (``seq2seq.plan``)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from seq2seq.cli.common import _fail, _setup_logging
from seq2seq.config import load_config


def plan_main(argv: Sequence[str] | None = None) -> int:
    """``seq2seq-plan --config FILE [key=value ...] --target T [--search] [--json FILE]``:
    compile the train step and a decode chunk for an accelerator this machine lacks and
    report memory, FLOPs, collectives and a roofline step time (``seq2seq.plan``)."""
    import os

    # the compilers come from libtpu / the CUDA plugin; the host's default backend stays the
    # CPU. Set before jax is imported (seq2seq.plan imports it), which reads it then: set
    # later, the CUDA plugin starts on a machine without a driver and registers no topology
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from seq2seq.plan import TARGETS

    parser = argparse.ArgumentParser(
        prog="seq2seq-plan",
        description="Compile the train step seq2seq-train would run, and a chunk of its test "
        "decode, for a TPU or GPU target without the device (jax.experimental.topologies), and "
        "print per-device memory against the device's, FLOPs (XLA and analytic), collectives, "
        "the attention kernel and a roofline step time (a lower bound).",
    )
    parser.add_argument("--config", help="YAML config (see configs/)")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. mesh.fsdp=8")
    parser.add_argument("--target", required=True, choices=list(TARGETS), help="what to plan for")
    parser.add_argument(
        "--search",
        action="store_true",
        help="try every (data, fsdp, tensor) mesh of the target and the micro-batch splits the "
        "batch allows; rank those that fit by predicted step time",
    )
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    _setup_logging()
    import json

    from seq2seq import plan
    from seq2seq.resolve import check_run_config, resolve_config

    try:
        config = load_config(args.config, args.overrides)
        config = resolve_config(config, validate=False).config
        check_run_config(config, mesh=False)
    except (ValueError, FileNotFoundError) as e:
        return _fail(str(e))
    record: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["seq2seq-plan", *(argv if argv is not None else sys.argv[1:])]),
        "config": args.config,
        "overrides": args.overrides,
    }
    try:
        if args.search:
            found = plan.search(config, args.target, progress=print)
            print(plan.format_search(found))
            record["search"] = [
                {**p.to_json(), "data.max_tokens": c.data.max_tokens} for c, p in found.ranked
            ]
            record["fits"] = bool(found.ranked)
            record["default"] = None if found.default is None else found.default.to_json()
            if found.ranked:
                cfg, best = found.ranked[0]
                print("\n" + plan.format_plan(best, cfg))
                record["plan"] = best.to_json()
        else:
            p = plan.plan(config, args.target)
            print(plan.format_plan(p, config))
            record["plan"] = p.to_json()
            record["fits"] = p.fits
    except (ValueError, RuntimeError) as e:
        return _fail(str(e))
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1, default=str), encoding="utf-8")
    return 0
