"""The quality comparison's records and table (``benchmarks/compare_quality.py``, issue 50).

Every finished training of the comparison writes one JSON record under ``--records``
(``docs/data/quality/`` by default, committed as the runs land) as ``PROXY/UNIT.json``, with
its test translations beside it (``UNIT.test.hyp.gz``, gzip without a time stamp, their
sha256 in the record) and, for ours, the run's SentencePiece model (``spm-SHA.model.gz``,
shared by the records that used it), so that a later session on a fresh clone trains the
peers and builds the table from the records alone. Units (``unit_name``):

* ``ours-pre-seedS`` / ``ours-post-seedS``: our preset with ``model.norm=pre`` / ``post``;
* ``ours-pre-seedS+KEY=VALUE``: a dev check of ours with extra overrides (dev scores only);
* ``peer-pre-seedS-POINT`` / ``peer-post-seedS-POINT``: a peer at a grid point
  (``peers.GridPoint.name``).

A record holds the proxy, system, seed, grid point, steps, seconds, dev and test BLEU and
chrF, the hypotheses' file and hash, the references' hash, the date, the machine, the
commit, and the ``settings`` it was made under; a rerun under the same settings skips it,
under other settings refuses to overwrite it (``read_record``).

``build`` turns the records into the table's figures (the peers' dev pick, the paired tests,
the appendix) and ``markdown`` into the text between the ``compare.py quality`` markers of
``docs/benchmarks.md``; neither trains anything.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SYSTEMS = ("ours-pre", "ours-post", "peer-post", "peer-pre")
LABELS = {
    "ours-pre": "ours, pre-norm",
    "ours-post": "ours, post-norm",
    "peer-post": "MarianMT, post-norm",
    "peer-pre": "nn.Transformer, pre-norm",
}
# each peer against ours of its norm placement; ours post-norm against ours pre-norm
BASELINE = {"ours-post": "ours-pre", "peer-pre": "ours-pre", "peer-post": "ours-post"}
PEER_OF = {"peer-post": "ours-post", "peer-pre": "ours-pre"}


class RecordError(ValueError):
    """A record that cannot be used as asked (the message names its file)."""


def sha256(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def lines_sha256(lines: list[str]) -> str:
    """The hash of ``lines`` as a file of one line each."""
    return sha256("".join(s + "\n" for s in lines))


def unit_name(system: str, seed: int, point: Any = None, dev_check: Sequence[str] = ()) -> str:
    """A record's file stem: ``ours-pre-seed1``, ``ours-pre-seed1+model.dropout_rate=0.15``,
    ``peer-pre-seed1-lr0.001-w400-rsqrt-d0.1``."""
    name = f"{system}-seed{seed}" + ("" if point is None else f"-{point.name}")
    for kv in dev_check:
        name += "+" + re.sub(r"[^A-Za-z0-9._=-]", "_", kv)
    return name


def record_path(records: Path, proxy: str, unit: str) -> Path:
    return records / proxy / f"{unit}.json"


def read_record(path: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The record at ``path`` if there is one made under ``settings``; None if there is none.

    Raises:
      RecordError: it was made under other settings (the differing keys named).
    """
    if not path.exists():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    theirs = record.get("settings", {})
    if theirs != settings:
        keys = sorted(k for k in {*theirs, *settings} if theirs.get(k) != settings.get(k))
        raise RecordError(
            f"{path} was made with other settings ({', '.join(keys)}: "
            f"{', '.join(f'{theirs.get(k)!r} here {settings.get(k)!r}' for k in keys)}); "
            "give another --records or remove it"
        )
    return record


def write_gz(path: Path, data: bytes) -> None:
    """``data`` gzipped to ``path`` without a time stamp (the same bytes on every machine)."""
    _replace(path, gzip.compress(data, mtime=0))


def _replace(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all (a temporary file, then ``os.replace``):
    a run killed while writing leaves no truncated record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_record(
    records: Path, proxy: str, unit: str, record: dict[str, Any], hyps: list[str] | None
) -> dict[str, Any]:
    """Write ``hyps`` (the test translations; None for a dev check) beside the record, then
    the record (last: it marks the training done); returns the record as written."""
    path = record_path(records, proxy, unit)
    if hyps is not None:
        text = "".join(h + "\n" for h in hyps)
        write_gz(path.with_name(f"{unit}.test.hyp.gz"), text.encode())
        record = {
            **record,
            "hypotheses": f"{proxy}/{unit}.test.hyp.gz",
            "hypotheses_sha256": sha256(text),
        }
    _replace(path, (json.dumps(record, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))
    print(f"  recorded {path}", flush=True)
    return record


def read_hypotheses(records: Path, record: dict[str, Any]) -> list[str]:
    """A record's test translations.

    Raises:
      RecordError: the file is missing or its hash is not the record's.
    """
    path = records / record["hypotheses"]
    if not path.exists():
        raise RecordError(f"{path}: missing (the record {record['unit']} names it)")
    text = gzip.decompress(path.read_bytes()).decode("utf-8")
    if sha256(text) != record["hypotheses_sha256"]:
        raise RecordError(f"{path}: its sha256 is not the one record {record['unit']} holds")
    return text[:-1].split("\n") if text else []


def save_tokenizer(records: Path, proxy: str, model: Path) -> str:
    """Keep the SentencePiece ``model`` under ``records/proxy`` (once per content); returns
    its path relative to ``records``."""
    data = model.read_bytes()
    name = f"{proxy}/spm-{sha256(data)[:12]}.model.gz"
    if not (records / name).exists():
        write_gz(records / name, data)
    return name


def load_tokenizer(records: Path, name: str, out: Path) -> Path:
    """The SentencePiece model ``name`` (``save_tokenizer``) unpacked under ``out``."""
    path = out / Path(name).name.removesuffix(".gz")
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.decompress((records / name).read_bytes()))
    return path


def load_records(records: Path, proxy: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Unit → record of ``proxy`` made under ``settings`` (the others are left out)."""
    found = {}
    for path in sorted((records / proxy).glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("settings") == settings:
            found[record["unit"]] = record
    return found


# -- the table's figures -------------------------------------------------------------------------


def dev_pick(candidates: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The candidate record with the highest dev BLEU (the first of equals); None if none."""
    best = None
    for r in candidates:
        if best is None or r["dev"]["bleu"] > best["dev"]["bleu"]:
            best = r
    return best


def grid_records(found: dict[str, Any], system: str, seed: int) -> list[dict[str, Any]]:
    """The grid's records of ``system`` (a peer) at ``seed``, in the order they were run."""
    rows = [r for r in found.values() if r["system"] == system and r["seed"] == seed and r["point"]]
    return sorted(rows, key=lambda r: r.get("order", 0))


def build(
    found: dict[str, dict[str, Any]],
    seeds: list[int],
    plain_name: str,
    planned_grid: int,
    references: dict[str, list[str]],
    records: Path,
) -> dict[str, Any]:
    """The table's figures from the records ``found`` (proxy → unit → record).

    Per proxy and seed, the rows ours pre-norm, ours post-norm, each peer's plain point
    (``plain_name``) and its dev pick (the best dev BLEU of its grid at ``seeds[0]``;
    ``planned_grid`` points planned, fewer recorded marks the pick provisional), with the
    paired tests (``seq2seq.evaluation.compare``: bootstrap 95% CIs and p-values, approximate
    randomization) of each against ``BASELINE``'s system on the proxy's test
    ``references``.

    Raises:
      RecordError: a record's references are not the proxy's, or its hypotheses are missing.
    """
    from seq2seq.evaluation import compare

    out: dict[str, Any] = {"proxies": {}}
    for proxy, units in found.items():
        refs = references[proxy]
        for r in units.values():
            if "references_sha256" in r and r["references_sha256"] != lines_sha256(refs):
                raise RecordError(f"{proxy}/{r['unit']}: its test references are not {proxy}'s")
        picks: dict[str, dict[str, Any]] = {}
        for system in PEER_OF:
            grid = grid_records(units, system, seeds[0])
            best = dev_pick(grid)
            picks[system] = {
                "picked": None if best is None else best["point"],
                "recorded": len(grid),
                "planned": planned_grid,
                "grid": [
                    {
                        "point": r["point"],
                        "dev_bleu": r["dev"]["bleu"],
                        "dev_chrf": r["dev"]["chrf"],
                        "steps": r["steps"],
                        "warmup_steps": r["warmup_steps"],
                        "horizon": r.get("horizon"),
                        "train_seconds": r["train_seconds"],
                        "picked": r is best,
                    }
                    for r in grid
                ],
            }
        seeds_out = {}
        for seed in seeds:
            rows: dict[str, dict[str, Any] | None] = {
                "ours-pre": units.get(unit_name("ours-pre", seed)),
                "ours-post": units.get(unit_name("ours-post", seed)),
            }
            for system in ("peer-post", "peer-pre"):
                rows[f"{system} plain"] = units.get(f"{system}-seed{seed}-{plain_name}")
                p = picks[system]["picked"]
                name = None if p is None else f"{system}-seed{seed}-{point_name(p)}"
                rows[f"{system} best"] = None if name is None else units.get(name)
            tests = {}
            for baseline, members in (
                ("ours-pre", ["ours-pre", "ours-post", "peer-pre plain", "peer-pre best"]),
                ("ours-post", ["ours-post", "peer-post plain", "peer-post best"]),
            ):
                present = [m for m in members if rows[m] is not None]
                if len(present) < 2 or present[0] != baseline:
                    continue
                systems = [(m, read_hypotheses(records, rows[m])) for m in present]  # type: ignore[arg-type]
                tests[baseline] = compare(systems, refs, metrics=("bleu", "chrf")).to_json()
            seeds_out[str(seed)] = {"rows": rows, "tests": tests}
        dev_checks = [r for r in units.values() if r.get("dev_check")]
        out["proxies"][proxy] = {"picks": picks, "seeds": seeds_out, "dev_checks": dev_checks}
    return out


def point_name(point: dict[str, Any]) -> str:
    """``GridPoint.name`` of a record's ``point``."""
    return (
        f"lr{point['learning_rate']:g}-w{point['warmup']}-{point['schedule']}-d{point['dropout']}"
    )


def _system_result(tests: dict[str, Any], row: str) -> tuple[str, dict[str, Any]] | None:
    """(baseline, the paired-test figures) of ``row`` in the seed's tests."""
    for baseline, t in tests.items():
        for s in t["systems"]:
            if s["name"] == row:
                return baseline, s
    return None


def _settings_text(r: dict[str, Any], picked: bool) -> str:
    if r["system"].startswith("ours"):
        return (
            f"lr {r['learning_rate']:g}, warmup {r['warmup_steps']} of {r['steps']} "
            f"({r['config']['train']['schedule']}), "
            f"dropout {r['dropout']:g}"
        )
    p = r["point"]
    warmup = f"{r['warmup_steps']}" + (" (ours' share)" if p["warmup"] == "ours" else "")
    end = f" of {r['horizon']}" if r.get("horizon") else ""
    return (
        f"lr {p['learning_rate']:g}, warmup {warmup}{end} ({p['schedule']}), "
        f"dropout {r['dropout']:g}" + (" — dev pick" if picked else "")
    )


def markdown(table: dict[str, Any], meta: dict[str, Any]) -> str:
    """The table, its notes and the appendix of the grid's dev scores, as Markdown."""
    f2 = lambda x: "—" if x is None else f"{x:.2f}"
    f3 = lambda x: "—" if x is None else f"{x:.3f}"
    lines = [
        f"Quality at the same training time: ours {meta['budget_text']} per run, each peer at "
        f"least ours' seconds and {meta['peer_seconds_at_least']:.0f} s; float32 on both "
        f"sides; test sets held out of the shipped train split; generated from the records "
        f"in `{meta['records']}` ({meta['recorded']} of {meta['planned']} planned trainings "
        "recorded).",
        "",
        "| proxy | seed | system | settings | steps | train s | dev BLEU | test BLEU ± 95% CI "
        "| test chrF ± 95% CI | p bootstrap, BLEU / chrF | p AR, BLEU / chrF | against |",
        "|---|--:|---|---|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    names = {
        "ours-pre": "ours, pre-norm",
        "ours-post": "ours, post-norm",
        "peer-post plain": "MarianMT (post-norm), plain",
        "peer-post best": "MarianMT (post-norm), best",
        "peer-pre plain": "nn.Transformer (pre-norm), plain",
        "peer-pre best": "nn.Transformer (pre-norm), best",
    }
    signatures = None
    for proxy, part in table["proxies"].items():
        for seed, s in part["seeds"].items():
            for row, label in names.items():
                r = s["rows"][row]
                if r is None:
                    empty = " |" * 8
                    lines.append(f"| {proxy} | {seed} | {label} | not run yet |{empty}")
                    continue
                got = _system_result(s["tests"], row)
                test = r["test"]
                ci: dict[str, float | None] = {"BLEU": None, "chrF": None}
                p_bs = p_ar = "— / —"
                against = ""
                if got is not None:
                    baseline, fig = got
                    ci = {m: fig[m]["ci95"] for m in ci}
                    if baseline != row:
                        p_bs = " / ".join(f3(fig[m]["p_bootstrap"]) for m in ci)
                        p_ar = " / ".join(f3(fig[m]["p_ar"]) for m in ci)
                        against = names[baseline]
                    signatures = s["tests"][baseline]["signatures"]
                bleu, chrf = (
                    f"{test[key]:.2f}" + ("" if ci[m] is None else f" ± {ci[m]:.2f}")
                    for key, m in (("bleu", "BLEU"), ("chrf", "chrF"))
                )
                picked = row.endswith("best")
                lines.append(
                    f"| {proxy} | {seed} | {label} | {_settings_text(r, picked)} | {r['steps']} | "
                    f"{r['train_seconds']:.0f} | {f2(r['dev']['bleu'])} | {bleu} | "
                    f"{chrf} | {p_bs} | {p_ar} | {against} |"
                )
    lines.append("")
    if signatures:
        lines.append(
            "- sacreBLEU on the detokenised test split; CIs and p-values of BLEU and chrF "
            f"(BLEU's bootstrap: `{signatures['BLEU']['bootstrap']}`; approximate randomization: "
            f"`{signatures['BLEU']['ar']}`); each peer against ours of its norm placement, "
            "ours post-norm against ours pre-norm."
        )
    for proxy, part in table["proxies"].items():
        counts = []
        for seed, s in part["seeds"].items():
            for ours, peer in (("ours-pre", "peer-pre plain"), ("ours-post", "peer-post plain")):
                a, b = s["rows"][ours], s["rows"][peer]
                if a and b:
                    counts.append(
                        f"seed {seed} {ours} {a['parameters']:,} / {peer.split()[0]} "
                        f"{b['parameters']:,}"
                    )
        if counts:
            lines.append(f"- {proxy}, trainable parameters: {'; '.join(counts)}.")
        recipe = [
            f"seed {r['seed']} {r['system']}: {r['steps']} steps (provisional "
            f"{r['provisional_steps']}), warmup {r['warmup_steps']} = "
            f"{100 * r['warmup_share']:.0f}% of them (provisional "
            f"{100 * r['warmup_steps'] / max(r['provisional_steps'], 1):.0f}%), dropout "
            f"{r['dropout']:g} (the rule at the real steps: {r['dropout_at_real_steps']:g})"
            for s in part["seeds"].values()
            for r in (s["rows"]["ours-pre"], s["rows"]["ours-post"])
            if r is not None
        ]
        if recipe:
            lines.append(f"- {proxy}, ours' recipe at the real step count: {'; '.join(recipe)}.")
    lines += [
        f"- Peers: {meta['peers']}",
        f"- Held-out test sets: {meta['heldout_text']}",
        f"- Runs: {meta['runs_text']}",
        "",
        "Appendix: the grid's dev scores (seed "
        f"{meta['seeds'][0]}, beam 4 on the proxy's dev split; each peer's best point by dev "
        "BLEU is its row above).",
        "",
        "| proxy | peer | point | dev BLEU | dev chrF | steps | warmup | end | train s |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for proxy, part in table["proxies"].items():
        for system, pick in part["picks"].items():
            for g in pick["grid"]:
                mark = " **(pick)**" if g["picked"] else ""
                lines.append(
                    f"| {proxy} | {LABELS[system]} | `{point_name(g['point'])}`{mark} | "
                    f"{g['dev_bleu']:.2f} | {g['dev_chrf']:.2f} | {g['steps']} | "
                    f"{g['warmup_steps']} | {g['horizon'] or '—'} | {g['train_seconds']:.0f} |"
                )
            if pick["recorded"] < pick["planned"]:
                lines.append(
                    f"| {proxy} | {LABELS[system]} | {pick['recorded']} of {pick['planned']} "
                    "grid points recorded: the pick is provisional |  |  |  |  |  |  |"
                )
    checks = [(proxy, r) for proxy, part in table["proxies"].items() for r in part["dev_checks"]]
    if checks:
        lines += [
            "",
            "Dev checks of ours (pre-norm) with extra overrides, against the same seed's ours:",
            "",
            "| proxy | seed | overrides | steps | dropout | dev BLEU | dev chrF | ours' dev BLEU |",
            "|---|--:|---|--:|--:|--:|--:|--:|",
        ]
        for proxy, r in checks:
            main = table["proxies"][proxy]["seeds"].get(str(r["seed"]), {}).get("rows", {})
            base = main.get("ours-pre") if main else None
            lines.append(
                f"| {proxy} | {r['seed']} | `{' '.join(r['dev_check'])}` | {r['steps']} | "
                f"{r['dropout']:g} | {r['dev']['bleu']:.2f} | {r['dev']['chrf']:.2f} | "
                f"{f2(base['dev']['bleu'] if base else None)} |"
            )
    return "\n".join(lines)
