"""``seq2seq-plan --search`` for every shipped config on every planned target, and the table.

Each (config, target) pair runs ``seq2seq-plan --config configs/NAME.yaml [overrides] --target T
--search --json docs/data/plan/KEY_T.json`` in its own process (a pair whose record already
holds a search is skipped: rerun with ``--force`` or delete the file), then the table of
``docs/scaling.md`` between its markers is rebuilt from the records alone: per pair, the default
mesh's peak memory, fit and headroom, XLA's FLOPs against the analytic count, the roofline step
time and target tokens/s, the collectives per step and the attention kernel, then the planner's
pick and its runner-up.

Usage::

    pip install -e '.[tpu,cuda12]'
    python -m benchmarks.plan_shipped                       # every pair, then the table
    python -m benchmarks.plan_shipped --only transformer_big --target tpu-v5e-8
    python -m benchmarks.plan_shipped --table-only          # the table from the records
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness import write_docs
from seq2seq.plan import Compiled, collectives_per_step

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "docs" / "data" / "plan"
DOCS = ROOT / "docs" / "scaling.md"
BEGIN, END = "<!-- plan_shipped.py table: begin -->", "<!-- plan_shipped.py table: end -->"
TARGETS = ("tpu-v5e-8", "tpu-v5p-8", "h100x8")
# key: (config file, overrides, targets); the last one is the case the planner exists for: the
# big model with four times the preset's batch on v5e's 16 GB
CONFIGS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "tatoeba_en_es": ("configs/tatoeba_en_es.yaml", (), TARGETS),
    "transformer_base": ("configs/transformer_base.yaml", (), TARGETS),
    "transformer_big": ("configs/transformer_big.yaml", (), TARGETS),
    "transformer_big_131072": (
        "configs/transformer_big.yaml",
        ("data.max_tokens=131072",),
        ("tpu-v5e-8",),
    ),
}


def record_path(key: str, target: str) -> Path:
    return RECORDS / f"{key}_{target}.json"


def run_pair(key: str, target: str) -> None:
    """Run the plan command's search for one pair, writing its record (exits on failure)."""
    path, overrides, _ = CONFIGS[key]
    exe = shutil.which("seq2seq-plan", path=str(Path(sys.executable).parent))
    if exe is None:
        raise SystemExit("seq2seq-plan is not installed beside this Python: pip install -e .")
    out = record_path(key, target)
    cmd = [exe, "--config", path, *overrides, "--target", target, "--search", "--json"]
    t0 = time.perf_counter()
    print(f"== {key} on {target}: {' '.join(cmd[1:])} {out.relative_to(ROOT)}", flush=True)
    done = subprocess.run([*cmd, str(out.relative_to(ROOT))], cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"{key} on {target}: seq2seq-plan exited {done.returncode}")
    record = json.loads(out.read_text(encoding="utf-8"))
    record["seconds"] = round(time.perf_counter() - t0, 1)  # the whole search, this machine
    out.write_text(json.dumps(record, indent=1), encoding="utf-8")
    print(f"   {record['seconds']:.0f} s", flush=True)


def _mesh(p: dict) -> str:
    m = p["mesh"]
    k = p["micro_batches"]
    return f"{m['data']}×{m['fsdp']}×{m['tensor']}" + (f", {k} micro-batches" if k > 1 else "")


def _per_step(p: dict) -> str:
    """The default's collectives per step: count and bytes per device, loops unrolled."""
    compiled = Compiled(collectives=p["train"]["collectives"])
    per_step = collectives_per_step(compiled, p["micro_batches"])
    return ", ".join(f"{k} ×{n} ({b / 1e6:.1f} MB)" for k, (n, b) in per_step.items()) or "none"


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.1f} ms" if ms >= 1 else f"{ms:.2f} ms"


def _pick(p: dict | None) -> str:
    if p is None:
        return "—"
    return f"{_mesh(p)}: {p['peak_bytes'] / 1e9:.2f} GB, ≥ {_ms(p['step_seconds'])}"


def table(records: dict[tuple[str, str], dict]) -> str:
    """The markdown table of the records, keyed by (config key, target)."""
    lines = [
        "| config | target | default mesh | peak | fits (headroom) | FLOPs/step XLA vs analytic "
        "| step ≥ | target tokens/s ≤ | collectives per step | attention | planner's pick "
        "| runner-up |",
        "|---|---|---|--:|---|--:|--:|--:|---|---|---|---|",
    ]
    for (key, target), r in records.items():
        d, ranked = r["default"], r.get("search") or []
        overrides = " ".join(CONFIGS[key][1])
        name = f"`{CONFIGS[key][0].split('/')[-1]}`" + (f" {overrides}" if overrides else "")
        fits = (
            f"yes ({d['headroom_bytes'] / 1e9:.1f} GB)"
            if d["fits"]
            else f"**no** ({-d['headroom_bytes'] / 1e9:.1f} GB short)"
        )
        if d["train"]["error"]:
            flops = step = tokens = per_step = "—"
        else:
            flops = (
                f"{d['xla_flops'] / 1e12:.2f} T vs {d['analytic_flops'] / 1e12:.2f} T "
                f"({d['flops_ratio']:.2f})"
            )
            step = _ms(d["step_seconds"])
            tokens = f"{d['target_tokens_per_second'] / 1e3:,.0f}k"
            per_step = _per_step(d)
        attention = d["train"]["attention"].split(" (")[0] or "—"
        pick = _pick(ranked[0] if ranked else None) if ranked else "**none fits**"
        lines.append(
            f"| {name} | {target} | {_mesh(d)} | {d['peak_bytes'] / 1e9:.2f} GB | {fits} | "
            f"{flops} | {step} | {tokens} | {per_step} | {attention} | {pick} | "
            f"{_pick(ranked[1] if len(ranked) > 1 else None)} |"
        )
    dates = sorted({r["date"] for r in records.values()})
    lines.append(
        f"\nFrom the records in [data/plan/](data/plan/) ({dates[0]} to {dates[-1]}), written by "
        "`python -m benchmarks.plan_shipped` (`seq2seq-plan --search --json` per row); per device; "
        "meshes as data×fsdp×tensor; a step time is the roofline lower bound of the train step."
        if dates
        else ""
    )
    return "\n".join(lines)


def searched(key: str, target: str) -> dict | None:
    """The pair's record if it holds a search (``--search --json``), else None."""
    path = record_path(key, target)
    if not path.exists():
        return None
    r = json.loads(path.read_text(encoding="utf-8"))
    return r if "search" in r else None


def load_records() -> dict[tuple[str, str], dict]:
    out = {}
    for key, (_, _, targets) in CONFIGS.items():
        for target in targets:
            if (r := searched(key, target)) is not None:
                out[key, target] = r
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=list(CONFIGS), help="these configs")
    parser.add_argument("--target", action="append", choices=TARGETS, help="these targets")
    parser.add_argument("--force", action="store_true", help="rerun pairs that have a record")
    parser.add_argument("--table-only", action="store_true", help="only rebuild the table")
    parser.add_argument("--docs", default=str(DOCS), help="the page whose table is rebuilt")
    args = parser.parse_args(argv)
    if not args.table_only:
        for key in args.only or CONFIGS:
            for target in (t for t in CONFIGS[key][2] if t in (args.target or TARGETS)):
                if args.force or searched(key, target) is None:
                    run_pair(key, target)
    text = table(load_records())
    print(text)
    write_docs(Path(args.docs), text, BEGIN, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
