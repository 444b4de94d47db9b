"""seq2seq-evaluate's metrics (BLEU, chrF, chrF++, TER), --lowercase and its comparison of
several systems, each checked against the ``sacrebleu`` command line on the same files."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import sacrebleu

from seq2seq import cli, evaluation

DATA = Path(__file__).resolve().parents[1] / "data" / "tatoeba-en-es"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def sacrebleu_cli(*args: str, seed: int | None = None) -> str:
    """Standard output of ``python -m sacrebleu ARGS`` (SACREBLEU_SEED=seed)."""
    env = dict(os.environ)
    if seed is not None:
        env["SACREBLEU_SEED"] = str(seed)
    done = subprocess.run(
        [sys.executable, "-m", "sacrebleu", *args],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return ANSI.sub("", done.stdout)


def paired_cells(text: str) -> tuple[list[tuple[str, str, str]], list[str], dict[str, str]]:
    """From sacreBLEU's text table (-f text): the 'score (mean ± ci)' cells in row order (the
    p-value-free AR table has none), the '(p = x)' values, the signature of each metric."""
    cells = re.findall(r"(-?\d+\.\d+) \((-?\d+\.\d+) ± (\d+\.\d+)\)", text)
    ps = re.findall(r"\(p = (\d\.\d{4})\)", text)
    sigs = dict(re.findall(r"^ - (\S+)\s+(nrefs:\S+)$", text, re.M))
    return cells, ps, sigs


def corrupt(lines: list[str], every: int, how: str) -> list[str]:
    """A deterministic 'system': every ``every``-th line damaged (last word dropped, or two
    words swapped)."""
    out = []
    for i, line in enumerate(lines):
        words = line.split()
        if i % every == 0 and len(words) > 2:
            words = words[:-1] if how == "drop" else [words[1], words[0], *words[2:]]
        out.append(" ".join(words))
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("systems")
    with gzip.open(DATA / "test.es.gz", "rt", encoding="utf-8") as f:
        refs = f.read().split("\n")[:300]
    paths = {}
    for name, lines in (
        ("ref", refs),
        ("a", corrupt(refs, 2, "drop")),
        ("b", corrupt(refs, 3, "swap")),
        ("c", corrupt(refs, 4, "drop")),
    ):
        paths[name] = tmp / f"{name}.txt"
        paths[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths


def check_against_sacrebleu(out: str, report: dict, system_files: list[Path], ref: Path, seed, n):
    """Our printed table and JSON equal sacreBLEU's --paired-bs / --paired-ar text tables on
    the same files, seed and sample counts (scores, means and CIs at 2 decimals, p-values at
    4, signatures exactly). BLEU, chrF and TER in one sacreBLEU call, chrF++ in another (its
    command line takes one chrF)."""
    inputs = ["-i", *map(str, system_files), "-f", "text", "-w", "2"]
    calls = {
        ("BLEU", "chrF", "TER"): ["-m", "bleu", "chrf", "ter"],
        ("chrF++",): ["-m", "chrf", "--chrf-word-order", "2"],
    }
    systems = report["systems"]
    for labels, metric_args in calls.items():
        for test, key in (("bs", "p_bootstrap"), ("ar", "p_ar")):
            args = [str(ref), *inputs, *metric_args, f"--paired-{test}", f"--paired-{test}-n"]
            text = sacrebleu_cli(*args, str(n[test]), seed=seed)
            cells, ps, sigs = paired_cells(text)
            for m, label in enumerate(labels):
                ours = report["signatures"][label]["bootstrap" if test == "bs" else "ar"]
                assert sigs[{"chrF++": "chrF2++", "chrF": "chrF2"}.get(label, label)] == ours
                assert ours in out  # printed too
                for i, system in enumerate(systems):
                    got = system[label]
                    if test == "bs":  # sacreBLEU prints the CI with the bootstrap test only
                        theirs = cells[i * len(labels) + m]
                        assert tuple(f"{got[k]:.2f}" for k in ("score", "mean", "ci95")) == theirs
                    if i:
                        assert f"{got[key]:.4f}" == ps[(i - 1) * len(labels) + m]
    # the printed table holds the same numbers as the JSON
    for system in systems[1:]:
        for label in ("BLEU", "chrF", "chrF++", "TER"):
            got = system[label]
            row = rf"{got['score']:.2f}\s+{got['mean']:.2f} ± {got['ci95']:.2f}"
            assert re.search(rf"{row}\s+{got['p_bootstrap']:.4f}\*?\s+{got['p_ar']:.4f}", out), (
                label,
                row,
            )


def test_comparison_of_hypothesis_files_equals_sacrebleus_command_line(files, tmp_path, capsys):
    report_path = tmp_path / "cmp.json"
    seed, n = 7, {"bs": 500, "ar": 2000}
    argv = [
        *("--hyp", str(files["a"]), "--hyp", str(files["b"]), "--hyp", str(files["c"])),
        *("--ref", str(files["ref"]), "--metrics", "bleu,chrf,chrf++,ter"),
        *("--paired-seed", str(seed), "--paired-bs-n", "500", "--paired-ar-n", "2000"),
        *("--json", str(report_path)),
    ]
    assert cli.evaluate_main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    report = json.loads(report_path.read_text(encoding="utf-8"))
    assert [s["name"] for s in report["systems"]] == [str(files[k]) for k in "abc"]
    assert report["seed"] == seed and report["num_sentences"] == 300
    # real differences: a damages every 2nd line, b every 3rd, c every 4th
    assert report["systems"][2]["BLEU"]["score"] > report["systems"][0]["BLEU"]["score"]
    check_against_sacrebleu(
        out, report, [files["a"], files["b"], files["c"]], files["ref"], seed, n
    )


def test_one_system_metrics_and_lowercase_equal_sacrebleus_command_line(tmp_path, capsys):
    """Mixed-case Cyrillic and Latin: --lowercase is sacreBLEU's -lc (BLEU) and
    --chrf-lowercase (chrF), signature included; TER is case-insensitive either way."""
    refs = ["Привет, Мир! Hello World.", "МОСКВА и London", "Он сказал: Tom is HERE."]
    hyps = ["привет, мир! hello world.", "Москва и LONDON", "он сказал: tom is here"]
    (tmp_path / "ref").write_text("\n".join(refs) + "\n", encoding="utf-8")
    (tmp_path / "hyp").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    argv = ["--hyp", str(tmp_path / "hyp"), "--ref", str(tmp_path / "ref")]
    for flags, theirs in (
        (["--lowercase"], ["-lc", "--chrf-lowercase"]),
        ([], []),
    ):
        ours_json = tmp_path / "one.json"
        metrics = ["--metrics", "bleu,chrf,ter"]
        assert cli.evaluate_main([*argv, *metrics, *flags, "--json", str(ours_json)]) == 0
        out = capsys.readouterr().out
        got = json.loads(ours_json.read_text(encoding="utf-8"))
        text = sacrebleu_cli(
            str(tmp_path / "ref"),
            "-i",
            str(tmp_path / "hyp"),
            "-m",
            "bleu",
            "chrf",
            "ter",
            "-w",
            "2",
            *theirs,
        )
        expected = {d["name"]: d for d in json.loads(text)}
        for label, name in (("BLEU", "BLEU"), ("chrF", "chrF2"), ("TER", "TER")):
            assert f"{got[label]['score']:.2f}" == f"{expected[name]['score']:.2f}"
            assert got[label]["signature"] == expected[name]["signature"]
            assert f"{label} = {got[label]['score']:.2f} ({got[label]['signature']})" in out
        case = "lc" if flags else "mixed"
        assert (
            f"case:{case}|" in got["BLEU"]["signature"]
            and f"case:{case}|" in got["chrF"]["signature"]
        )
    # the scoring API: lowercasing changes BLEU here, and says so
    lc, mixed = evaluation.score(hyps, refs, lowercase=True), evaluation.score(hyps, refs)
    assert lc.bleu == pytest.approx(
        sacrebleu.corpus_bleu([h.lower() for h in hyps], [[r.lower() for r in refs]]).score
    )
    assert lc.bleu > mixed.bleu + 10 and "case:lc" in lc.bleu_signature
    assert "case:mixed" in mixed.bleu_signature and "case:lc" in lc.chrf_signature


def test_evaluate_errors(files, tmp_path, capsys):
    base = ["--ref", str(files["ref"])]
    (tmp_path / "short").write_text("uno\n", encoding="utf-8")
    for argv, message in (
        ([], "give --workdir (a run to decode with) or --hyp"),
        (["--hyp", str(files["a"])], "--hyp without --workdir needs --ref"),
        (["--hyp", str(files["a"]), *base, "--metrics", "bleu,meteor"], "unknown metric 'meteor'"),
        (
            ["--hyp", str(files["a"]), "--hyp", str(tmp_path / "short"), *base],
            f"{tmp_path / 'short'} has 1 lines but {files['ref']} has 300",
        ),
        (["--hyp", str(files["a"]), "--hyp", str(files["a"]), *base], "is given twice"),
        (
            ["--hyp", str(files["a"]), "--hyp", str(files["b"]), *base, "--output", "x"],
            "use --hyp-dir with several",
        ),
    ):
        assert cli.evaluate_main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
    with pytest.raises(SystemExit):
        cli.evaluate_main(["--hyp", str(files["a"]), *base, "--paired-seed", "0"])
    assert "--paired-seed" in capsys.readouterr().err


@pytest.mark.slow
def test_checkpoints_of_a_run_compared_through_evaluate(tmp_path, capsys):
    """Two checkpoints of one run (--compare): decoded, written to --hyp-dir, and the printed
    comparison equals sacreBLEU's command line on those files; without --compare the same
    arguments are one ensemble (one system, the old output)."""
    from test_score_ensemble_commands import LINES, make_run, shipped

    from seq2seq.config import TokenizerConfig
    from seq2seq.data.tokenizer import train_or_load

    train_or_load(sum(shipped(0, 400), []), TokenizerConfig(vocab_size=200), tmp_path / "spm")
    run = make_run(tmp_path / "run", tmp_path / "spm", {10: 5, 20: 0})
    src, ref = tmp_path / "src", tmp_path / "ref"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    ref.write_text("\n".join(shipped(0, len(LINES))[1]) + "\n", encoding="utf-8")
    models = ["--workdir", run, "--step", "10", "--step", "20"]
    hyp_dir, report_path = tmp_path / "hyps", tmp_path / "cmp.json"
    argv = [*models, "--src", str(src), "--ref", str(ref), "--compare", "--beam", "1"]
    options = ["--hyp-dir", str(hyp_dir), "--json", str(report_path), "--paired-ar-n", "1000"]
    assert cli.evaluate_main([*argv, *options]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    report = json.loads(report_path.read_text(encoding="utf-8"))
    names = [s["name"] for s in report["systems"]]
    assert names == [f"{run}@10", f"{run}@20"]
    assert f"{run}@20: 6 sentences in" in out
    files = [hyp_dir / (n.strip("/").replace("/", "_").replace("@", "_") + ".txt") for n in names]
    assert files[0].read_text(encoding="utf-8") != files[1].read_text(encoding="utf-8")
    check_against_sacrebleu(out, report, files, ref, 12345, {"bs": 1000, "ar": 1000})
    # a hypothesis file first (the baseline), then a decoded checkpoint; two runs compared
    small = ["--metrics", "bleu", "--paired-bs-n", "100", "--paired-ar-n", "100"]
    other = make_run(tmp_path / "other", tmp_path / "spm", {20: 0})  # = run's step 20
    for systems, expected in (
        (["--hyp", str(files[1]), "--workdir", run, "--step", "10"], [str(files[1]), names[0]]),
        (["--workdir", run, "--workdir", other, "--compare"], [run, other]),
    ):
        argv = [*systems, "--src", str(src), "--ref", str(ref), "--beam", "1", *small]
        assert cli.evaluate_main([*argv, "--json", str(report_path)]) == 0
        capsys.readouterr()
        mixed = json.loads(report_path.read_text(encoding="utf-8"))["systems"]
        assert [s["name"] for s in mixed] == expected
        # step 10 decodes as in the checkpoint comparison; run@20 (its default) is other@20
        assert (
            mixed[1]["BLEU"]["score"]
            == report["systems"][0 if systems[0] == "--hyp" else 1]["BLEU"]["score"]
        )
        if systems[0] != "--hyp":
            assert mixed[0]["BLEU"]["score"] == mixed[1]["BLEU"]["score"]
            # identical outputs: sacreBLEU counts only strictly larger differences, so p is
            # its smallest value, 1 / (n + 1) (docs/evaluation.md says so)
            assert mixed[1]["BLEU"]["p_bootstrap"] == mixed[1]["BLEU"]["p_ar"] == 1 / 101
    # the ensemble of the two: one system, printed as before
    assert cli.evaluate_main([*models, "--src", str(src), "--ref", str(ref), "--beam", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("BLEU = ") and "\nchrF = " in out and "p (bs)" not in out


class FakeComet:
    """Stands in for ``comet`` (not installed here): records the load, and scores a
    hypothesis 1 when it equals its reference, else 0 (system score: the mean)."""

    loaded: list = []

    @classmethod
    def load_from_checkpoint(cls, path, **kwargs):
        cls.loaded.append((path, kwargs))
        return cls()

    def predict(self, data, batch_size, gpus, progress_bar):
        assert gpus == 0 and all(set(d) == {"src", "mt", "ref"} for d in data)
        scores = [float(d["mt"] == d["ref"]) for d in data]
        return types.SimpleNamespace(scores=scores, system_score=sum(scores) / len(scores))


def test_comet_errors_and_plumbing(files, tmp_path, capsys, monkeypatch):
    """Offline: what runs without the comet extra (the errors), and our plumbing with a
    stand-in module. A real COMET checkpoint is not run here (no extra, no network)."""
    ckpt = tmp_path / "model.ckpt"
    base = ["--hyp", str(files["a"]), "--ref", str(files["ref"]), "--src", str(files["ref"])]
    for argv, message in (
        (base + ["--metrics", "bleu,comet"], "--metrics comet needs --comet-model PATH"),
        (
            base + ["--metrics", "comet", "--comet-model", str(ckpt)],
            f"--comet-model {ckpt}: no such file",
        ),
        (base[:4] + ["--metrics", "comet"], "--metrics comet needs the sources: give --src"),
        (base + ["--metrics", "bleu"], "--src without --workdir is only read by --metrics comet"),
    ):
        assert cli.evaluate_main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
    ckpt.write_bytes(b"not a checkpoint")
    monkeypatch.setitem(sys.modules, "comet", None)  # as if the extra were not installed
    assert cli.evaluate_main(base + ["--metrics", "comet", "--comet-model", str(ckpt)]) == 2
    assert "needs the comet extra: pip install -e '.[comet]'" in capsys.readouterr().err

    monkeypatch.setitem(sys.modules, "comet", FakeComet)
    report_path = tmp_path / "comet.json"
    argv = [*base, "--hyp", str(files["ref"]), "--metrics", "bleu,comet", "--comet-model"]
    argv += [str(ckpt), "--json", str(report_path), "--paired-bs-n", "10", "--paired-ar-n", "10"]
    assert cli.evaluate_main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert FakeComet.loaded[-1] == (str(ckpt), {"local_files_only": True})
    refs = files["ref"].read_text(encoding="utf-8").splitlines()
    same = sum(a == r for a, r in zip(files["a"].read_text(encoding="utf-8").splitlines(), refs))
    report = json.loads(report_path.read_text(encoding="utf-8"))
    expected = {str(files["a"]): same / len(refs), str(files["ref"]): 1.0}
    assert report["COMET"] == {"model": str(ckpt), "scores": expected}
    assert f"COMET = {same / len(refs):.4f} ({files['a']}; model {ckpt})" in out
    assert "p (bs)" in out  # BLEU is still compared


def test_evaluate_returns_the_report_the_command_writes(files, tmp_path, capsys):
    """``evaluation.evaluate`` does seq2seq-evaluate's work and returns a value: its JSON is
    the command's ``--json`` and its text what the command prints; a decoded system (here a
    stand-in) is opened when its turn comes and timed."""
    one = ["--hyp", str(files["a"]), "--ref", str(files["ref"]), "--metrics", "bleu,ter"]
    assert cli.evaluate_main([*one, "--json", str(tmp_path / "one.json")]) == 0
    printed = capsys.readouterr().out
    report = evaluation.evaluate(
        str(files["ref"]), hypotheses=[str(files["a"])], metrics=["bleu", "ter"]
    )
    assert report.to_json() == json.loads((tmp_path / "one.json").read_text(encoding="utf-8"))
    assert report.text() + "\n" == printed and report.timings == []

    refs = files["ref"].read_text(encoding="utf-8").splitlines()
    opened = []

    class Echo:  # translates every source into its reference
        def translate(self, lines, progress=False, source=None):
            return [[evaluation_hypothesis(r)] for r in refs[: len(lines)]]

    def open_echo():
        opened.append(len(opened))
        return evaluation.Decoding(None, Echo(), "the search")

    found = evaluation.evaluate(
        str(files["ref"]),
        sources=str(files["ref"]),
        hypotheses=[str(files["a"])],
        decoders=[evaluation.Decoder("echo", open_echo)],
        bootstrap_samples=10,
        ar_trials=10,
    )
    assert opened == [0] and [t.system for t in found.timings] == ["echo"]
    assert found.decoded() == [("echo", refs)] and isinstance(found.scores, evaluation.Comparison)
    assert found.to_json()["systems"][1]["BLEU"]["score"] == pytest.approx(100.0)
    assert found.text().splitlines()[-1].startswith(f"{len(refs)} sentences in ")
    assert found.text().endswith("sentences/s), the search")


def evaluation_hypothesis(text):
    from seq2seq.translation import Hypothesis

    return Hypothesis(text, (), 0.0, 0.0)
