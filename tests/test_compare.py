"""benchmarks/compare.py on tiny shapes (``--smoke``): the peers build, convert and run beside ours,
and the JSON and the table have their layout. Speed is not asserted here (docs/benchmarks.md)."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- compare.py table: begin -->", "<!-- compare.py table: end -->"
SYSTEMS = ("ours", "pytorch", "ct2_float32", "ct2_int8")
# Unoptimised XLA code compiles about twice as fast; a smoke run measures nothing.
FAST_XLA = {
    "XLA_FLAGS": "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
}


def test_without_the_extra_it_says_what_to_install(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.compare", "--smoke"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "needs the optional extra 'compare' (torch" in proc.stderr
    assert "pip install -e '.[compare]'" in proc.stderr and "--index-url" in proc.stderr


def test_smoke_times_every_pair(tmp_path):
    for name in ("torch", "transformers", "ctranslate2"):
        pytest.importorskip(
            name,
            reason=f"{name} is not installed: it comes with the optional "
            "extra 'compare' (see .ci/run, which installs it)",
        )
    out, docs = tmp_path / "compare.json", tmp_path / "benchmarks.md"
    docs.write_text(f"before\n{BEGIN}\nold table\n{END}\nafter\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.compare",
            "--smoke",
            "--json",
            str(out),
            "--docs",
            str(docs),
        ],
        cwd=ROOT,
        env={**os.environ, **FAST_XLA},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())

    m = r["meta"]
    assert m["machine"]["cpu"] and m["threads"] >= 1 and m["date"]
    # both precisions in the same rounds, each with the peak of its own matmul dtype
    assert m["precisions"] == ["float32", "bfloat16"]
    assert set(m["peak_gflops_per_second"]) == {"float32", "bfloat16"}
    assert all(m["versions"][k] for k in ("jax", "flax", "torch", "transformers", "ctranslate2"))
    assert len(r["rounds"]) == m["rounds"] == 2
    assert set(r["summary"]) == {"smoke float32", "smoke bfloat16"}
    # the rounds alternate the order of the precisions
    assert list(r["rounds"][0]) == ["smoke float32", "smoke bfloat16"]
    assert list(r["rounds"][1]) == ["smoke bfloat16", "smoke float32"]
    s = r["summary"]["smoke bfloat16"]
    assert set(s) == {"train", "beam4", "greedy"}
    assert set(s["train"]["figures"]) == {"ours", "pytorch"}
    for task in ("beam4", "greedy"):
        assert set(s[task]["figures"]) == set(SYSTEMS)
    for task, t in s.items():
        for system, f in t["figures"].items():
            assert f["n"] == 2 and 0 < f["min"] <= f["median"] <= f["max"], (task, system, f)
        assert set(t["ours_over"]) == set(t["figures"]) - {"ours"}
        assert t["goals"] == {}  # no goals on smoke shapes
    assert 0 < r["rounds"][0]["smoke bfloat16"]["train"]["ours"]["mfu"] < 1

    text = docs.read_text()
    assert text.startswith(f"before\n{BEGIN}\nMeasured by `benchmarks/compare.py`")
    assert text.endswith(f"{END}\nafter\n") and "old table" not in text
    assert "ours float32 against PyTorch float32" in text and "bfloat16 autocast" in text
    for variant in ("smoke float32", "smoke bfloat16"):
        assert f"| {variant} | beam 4 | sentences/s |" in text
        assert f"| {variant} | training |" in text


def test_pytorch_autocast_runs_its_matmuls_in_bfloat16():
    """The bfloat16 row's peer really computes in bfloat16 (autocast), the float32 row's not."""
    torch = pytest.importorskip("torch", reason="torch comes with the optional extra 'compare'")
    from benchmarks.peers import Marian

    layer = torch.nn.Linear(4, 4)
    x = torch.ones(2, 4)
    with Marian.autocast("bfloat16"):
        assert layer(x).dtype == torch.bfloat16
    with Marian.autocast("float32"):
        assert layer(x).dtype == torch.float32


def test_joined_pairs_stay_aligned_and_use_every_line():
    from benchmarks.compare_quality import join_consecutive

    src = [f"s{i}" for i in range(101)]
    tgt = [f"t{i}" for i in range(101)]
    js, jt = join_consecutive(src, tgt, seed=0)
    assert " ".join(js).split() == src and " ".join(jt).split() == tgt
    sizes = [len(s.split()) for s in js]
    assert sizes == [len(t.split()) for t in jt]
    assert set(sizes[:-1]) == {2, 3, 4} and 1 <= sizes[-1] <= 4  # the last run may be short
    for s, t in zip(js, jt):  # pair k of the source is pair k of the target
        assert [w[1:] for w in s.split()] == [w[1:] for w in t.split()]
    assert join_consecutive(src, tgt, seed=0) == (js, jt)  # a function of the seed
    with pytest.raises(ValueError, match="101 source lines but 100 target lines"):
        join_consecutive(src, tgt[:-1], seed=0)


def _shared_corpus():
    """~700 synthetic pairs in groups that share a sentence (case and spacing vary), a few
    groups of more than 8 pairs, and singletons."""
    en, es = [], []
    for g in range(150):  # chains: pair k shares its English with k-1 or its Spanish
        for k in range(1 + g % 5):
            en.append(f"Sentence {g} {k // 2}." if k % 2 else f"sentence  {g} {k // 2}.")
            es.append(f"Frase {g} {(k + 1) // 2}." if k % 3 else f"FRASE {g} {(k + 1) // 2}.")
    for g in range(4):  # groups of 12 pairs: one English sentence, many Spanish ones
        for k in range(12):
            en.append(f"Go {g}.")
            es.append(f"Vete {g} {k}.")
    for i in range(200):
        en.append(f"single {i}")
        es.append(f"sola {i}")
    order = list(range(len(en)))
    random.Random(0).shuffle(order)
    return [en[i] for i in order], [es[i] for i in order]


def test_carved_heldout_sets_are_whole_groups_kept_out_of_every_proxys_training():
    from benchmarks.compare_quality import PROXIES, carve_heldout, proxy_splits, sentence_key

    en, es = _shared_corpus()
    carved = carve_heldout(en, es, pairs=40)
    assert carve_heldout(en, es, pairs=40) == carved  # deterministic
    assert carve_heldout(en, es, pairs=40, salt="other").heldout != carved.heldout
    keys = lambda idx: (
        {(0, sentence_key(en[i])) for i in idx} | {(1, sentence_key(es[i])) for i in idx}
    )
    held = [carved.heldout[n] for n in PROXIES]
    for idx in held:
        assert 40 <= len(idx) < 40 + 8  # whole groups, the last one may overshoot
        assert not keys(idx) & keys(carved.train)  # no sentence shared with train: groups whole
        assert all(not en[i].startswith("Go ") for i in idx)  # groups of 12 stay in train
    for a, b in ((0, 1), (0, 2), (1, 2)):
        assert not set(held[a]) & set(held[b]) and not keys(held[a]) & keys(held[b])
    assert sorted(carved.train + [i for idx in held for i in idx]) == list(range(len(en)))
    assert carved.max_group == 8 and all(carved.groups[n] >= 40 / 5 for n in PROXIES)

    dev = ([f"dev {i}" for i in range(30)], [f"desarrollo {i}" for i in range(30)])
    shipped = {"train": (en, es), "dev": dev}
    splits = {n: proxy_splits(n, shipped, carved, small_pairs=100, small_dev=10) for n in PROXIES}
    tests = {sentence_key(s) for idx in held for s in [en[i] for i in idx] + [es[i] for i in idx]}
    for name in ("full", "small"):
        train = splits[name]["train"][0] + splits[name]["train"][1]
        assert not tests & {sentence_key(s) for s in train}, name
    assert [len(splits["small"][s][0]) for s in ("train", "dev")] == [100, 10]
    assert splits["full"]["train"][0] == [en[i] for i in carved.train]
    assert splits["full"]["dev"] == dev and splits["small"]["test"][0] == [
        en[i] for i in carved.heldout["small"]
    ]
    long = splits["long"]  # full's training pairs joined: no held-out sentence either
    for side in (0, 1):
        assert " ".join(long["train"][side]) == " ".join(splits["full"]["train"][side])
    assert " ".join(long["test"][0]) == " ".join(en[i] for i in carved.heldout["long"])
    with pytest.raises(ValueError, match="too few pairs for 3 held-out sets of 300"):
        carve_heldout(en, es, pairs=300)


def test_peer_schedules_warm_up_then_decay_as_their_formulas_say():
    from benchmarks.peers import horizon_for_seconds, linear_rate, rsqrt_rate, warmup_from_share

    peak, warmup, end = 2e-3, 10, 50
    assert linear_rate(0, peak, warmup, None) == pytest.approx(peak / warmup)
    assert linear_rate(4, peak, warmup, None) == pytest.approx(peak / 2)
    assert linear_rate(warmup - 1, peak, warmup, end) == pytest.approx(peak)  # the W-th update
    assert linear_rate(30, peak, warmup, None) == peak  # before the end is fixed
    rates = [linear_rate(c, peak, warmup, end) for c in range(warmup - 1, end + 3)]
    steps = [a - b for a, b in zip(rates, rates[1:])]
    assert steps[: end - warmup + 1] == pytest.approx(
        [peak / (end - warmup + 1)] * (end - warmup + 1)
    )
    assert rates[end - warmup + 1 :] == [0.0, 0.0, 0.0]  # zero from the end on
    assert linear_rate(end - 1, peak, warmup, end) == pytest.approx(peak / (end - warmup + 1))
    # the warmup: a fifth of the updates that fit after the probe (10 passes in 2 s: 5/s)
    assert warmup_from_share(0.2, 10, 2.0, 100.0) == round(0.2 * 98 * 5)
    assert warmup_from_share(0.2, 10, 200.0, 100.0) == 1  # no time left: at least one step
    # the end: 20 updates in 10 s after the probe (2/s), 88 s left of 100
    assert horizon_for_seconds(20, 12.0, 2.0, 100.0) == 20 + 176
    assert horizon_for_seconds(20, 120.0, 2.0, 100.0) == 20  # the budget is spent: end here
    # the plain recipe's shape: linear to the peak at update 400, then 1/sqrt
    assert rsqrt_rate(0, 400) == pytest.approx(1 / 400)
    assert rsqrt_rate(399, 400) == 1.0
    assert rsqrt_rate(1599, 400) == pytest.approx(0.5)  # n = 1600 = 4 W: sqrt(1/4)


def _tiny_quality_args():
    tiny = "model.d_model=32 model.d_ff=64 model.num_heads=2 model.num_encoder_layers=1 "
    tiny += "model.num_decoder_layers=1 tokenizer.vocab_size=200 train.steps=3 "
    tiny += "train.eval_every=3 train.warmup_steps=1"
    # short output limits: the untrained models never stop early
    tiny += " decode.max_len_a=0.3 decode.max_len_b=3"
    return [a for kv in tiny.split() for a in ("--set", kv)]


@pytest.mark.slow  # ~5 min on 2 cores: ours 4 runs, each peer 2 grid points and 1-2 at seed 2
def test_quality_comparison_records_each_training_and_resumes_from_the_records(tmp_path):
    for name in ("torch", "transformers", "sentencepiece"):
        pytest.importorskip(name, reason=f"{name} comes with the optional extra 'compare'")
    records, docs = tmp_path / "records", tmp_path / "benchmarks.md"
    docs.write_text(
        "x\n<!-- compare.py quality: begin -->\nold\n<!-- compare.py quality: end -->\ny\n"
    )
    argv = [sys.executable, "-m", "benchmarks.compare", "--quality", "--proxies", "small"]
    argv += ["--limit-lines", "40", "--out", str(tmp_path / "q"), "--records", str(records)]
    argv += ["--seeds", "1,2", "--budget", "0", "--peer-seconds", "2"]
    argv += ["--peer-lrs", "1e-3", "--peer-warmups", "400,ours", "--peer-schedules", "rsqrt"]
    argv += ["--peer-dropouts", "0.1", "--json", str(tmp_path / "q.json"), *_tiny_quality_args()]

    def run(*extra):
        proc = subprocess.run(
            [*argv, *extra],
            cwd=ROOT,
            env={**os.environ, **FAST_XLA},
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        return proc.stdout

    stale = tmp_path / "q" / "small" / "ours-pre-seed1"  # a run killed before its record
    stale.mkdir(parents=True)
    (stale / "config.yaml").write_text("not the run's\n")
    first = run("--docs", str(docs))
    assert "plan small: 12 trainings, 0 recorded" in first  # 4 ours + 2 × (2 + 2)
    assert f"ours-pre-seed1: removing the unfinished run {stale}" in first  # not resumed
    found = {p.stem: json.loads(p.read_text()) for p in (records / "small").glob("*.json")}
    ours = {s: found[f"{s}-seed{k}"] for s in ("ours-pre", "ours-post") for k in (1, 2)}
    for r in found.values():  # a disturbed training can be told from a quiet one
        assert all(x >= 0 for x in r["load_average"].values()), r["load_average"]
    for r in ours.values():
        assert r["steps"] == r["provisional_steps"] == 3 and r["warmup_share"] == 1 / 3
        assert (records / r["tokenizer"]).exists() and r["test"]["lines"] == 40
    picks = {}
    for system, norm in (("peer-pre", "ours-pre"), ("peer-post", "ours-post")):
        grid = [r for u, r in found.items() if u.startswith(f"{system}-seed1-")]
        grid.sort(key=lambda r: r["order"])  # the grid's order: the first of equals wins
        assert [r["point"]["warmup"] for r in grid] == ["400", "ours"]
        best = max(grid, key=lambda r: r["dev"]["bleu"])  # the dev pick
        picks[system] = best["point"]
        seed2 = {u for u in found if u.startswith(f"{system}-seed2-")}
        assert f"{system}-seed2-lr0.001-w400-rsqrt-d0.1" in seed2  # the plain point
        name = "lr{learning_rate:g}-w{warmup}-{schedule}-d{dropout}".format(**best["point"])
        assert f"{system}-seed2-{name}" in seed2 and len(seed2) <= 2
        for u in seed2 | {r["unit"] for r in grid}:
            r, o = found[u], found[f"{norm}-seed{found[u]['seed']}"]
            assert r["parameters"] == o["parameters"]  # the same size as ours, both ways
            assert r["train_seconds"] >= max(o["train_seconds"], 2.0)
            assert r["ours"] == o["unit"] and r["references_sha256"] == o["references_sha256"]
    table = json.loads((tmp_path / "q.json").read_text())["proxies"]["small"]
    assert {s: p["picked"] for s, p in table["picks"].items()} == picks
    tests = table["seeds"]["1"]["tests"]
    assert [s["name"] for s in tests["ours-post"]["systems"]] == [
        "ours-post",
        "peer-post plain",
        "peer-post best",
    ]
    text = docs.read_text()
    assert "old" not in text and text.endswith("end -->\ny\n")
    figures = tests["ours-post"]["systems"][1]  # the plain MarianMT against ours post-norm
    row = next(
        x for x in text.splitlines() if x.startswith("| small | 1 | MarianMT (post-norm), plain")
    )
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[8].endswith(f"± {figures['chrF']['ci95']:.2f}")  # chrF's CI and p-values too
    assert cells[10] == f"{figures['BLEU']['p_ar']:.3f} / {figures['chrF']['p_ar']:.3f}"
    for label in (
        "ours, pre-norm",
        "MarianMT (post-norm), best",
        "nn.Transformer (pre-norm), plain",
    ):
        assert f"| small | 2 | {label} |" in text
    done = 4 + sum(2 + 1 + (p["warmup"] != "400") for p in picks.values())  # pick ≠ plain: +1
    assert f"({done} of {done} planned trainings recorded)" in text and "Appendix" in text

    second = run("--docs", str(docs))  # every training is recorded: nothing runs
    assert second.count("skip ") == done and "peer-pre step" not in second
    assert "seq2seq train" not in second and "  recorded /" not in second
    again = tmp_path / "again.md"  # the table from the records alone
    again.write_text("<!-- compare.py quality: begin -->\n<!-- compare.py quality: end -->\n")
    third = run("--from-records", "--docs", str(again))
    assert "skip " not in third and again.read_text().split("begin -->")[1] == text.split(
        "begin -->"
    )[1].removesuffix("y\n")


def test_a_failed_training_is_named_and_the_others_go_on():
    from types import SimpleNamespace

    from benchmarks import compare_quality

    def unit(args, proxy, data, system, seed):
        if seed == 1:
            raise RuntimeError("seq2seq-train failed (exit 1):\nloss is NaN")
        return {"seed": seed}

    args = SimpleNamespace(failed=[])
    runs = [compare_quality.attempt(args, unit, "full", None, "ours-post", s) for s in (1, 2)]
    assert runs == [None, {"seed": 2}]
    assert args.failed == ["full ours-post seed 1: seq2seq-train failed (exit 1):"]


def test_a_peer_trains_only_on_a_machine_like_its_ours(tmp_path, capsys):
    # the peer's seconds are ours': on a machine of other vector units they buy other steps
    from types import SimpleNamespace

    from benchmarks import compare_quality
    from benchmarks.peers import PLAIN

    settings = {"budget_seconds": 780}
    ours = {"unit": "ours-pre-seed1", "machine": "AMD EPYC (avx2), 2 cores", "settings": settings}
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "ours-pre-seed1.json").write_text(json.dumps(ours))
    here = "AMD EPYC (avx2, avx512f, avx512_bf16), 2 cores"
    args = SimpleNamespace(records_dir=tmp_path, settings=settings, machine=here)
    assert compare_quality.run_peer(args, "full", tmp_path, "peer-pre", 1, PLAIN, 0) is None
    waits = f"waits for a machine like ours-pre-seed1's ({ours['machine']}; this one: {here})"
    assert waits in capsys.readouterr().out


def test_a_pause_file_holds_the_next_training_back(tmp_path, monkeypatch, capsys):
    import threading
    from types import SimpleNamespace

    from benchmarks import compare_quality

    monkeypatch.setattr(compare_quality, "PAUSE_POLL_SECONDS", 0.01)
    args = SimpleNamespace(out_dir=tmp_path)
    compare_quality.wait_while_paused(args, "ours-pre-seed1")  # no file: no wait
    assert capsys.readouterr().out == ""
    (tmp_path / "PAUSE").touch()
    waiter = threading.Thread(target=compare_quality.wait_while_paused, args=(args, "u"))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # held back while the file exists
    (tmp_path / "PAUSE").unlink()
    waiter.join(5)
    assert not waiter.is_alive()
    said = capsys.readouterr().out
    assert said == f"  u: paused while {tmp_path / 'PAUSE'} exists\n  u: resumed\n"


def test_quality_options_are_checked(tmp_path, capsys):
    from benchmarks import compare_quality

    plain = "the grid must hold the plain recipe's point (learning rate 0.001, warmup 400"
    for argv, message in (
        (["--proxies", "full,tiny"], "--proxies: unknown proxy 'tiny'"),
        (["--seeds", "1"], "--seeds 1: needs at least 2 values"),
        (["--seeds", "1,1"], "--seeds 1,1: a value is repeated"),
        (["--peer-lrs", "1e-3,x"], "--peer-lrs 1e-3,x: not a comma-separated list"),
        (["--peer-lrs", "5e-4,2e-3"], plain),
        (["--peer-warmups", "ours"], plain),
        (["--peer-dropouts", "0.3,0.1"], plain),
        (["--peer-warmups", "400,0"], "--peer-warmups 400,0: '0' is not a step count > 0"),
        (["--peer-schedules", "rsqrt,cosine"], "'cosine' is not rsqrt or linear"),
        (["--systems", "ours,peer"], "--systems ours,peer: 'ours' is not a system"),
        (["--dev-check", "dropout"], "--dev-check dropout: not KEY=VALUE"),
        (["--corpus", str(tmp_path)], "train.en[.gz] is missing"),
        (["--config", "nowhere.yaml"], "--config nowhere.yaml"),
        (["--test-pairs", "50000"], "--test-pairs 50000: the 108126 groups of at most 8"),
    ):
        args = compare_quality.parse_args(
            ["--out", str(tmp_path / "q"), "--records", str(tmp_path / "r"), *argv]
        )
        assert compare_quality.run(args, "machine") == 2, argv
        assert message in capsys.readouterr().err, argv
    assert not (tmp_path / "q").exists() and not (tmp_path / "r").exists()  # nothing started


def test_the_default_plan_holds_the_plain_point_and_says_its_hours(tmp_path, capsys):
    from benchmarks import compare_quality
    from benchmarks.peers import PLAIN, GridPoint

    args = compare_quality.parse_args(["--records", str(tmp_path)])
    compare_quality.check(args)
    grid = compare_quality.peer_grid(args)
    assert len(grid) == 3 * 2 * 2 and PLAIN in grid  # rates × warmups × schedules
    assert {p.schedule for p in grid} == {"rsqrt", "linear"} and {p.warmup for p in grid} == {
        "400",
        "ours",
    }
    # per proxy: ours 2 norms × 2 seeds; per peer 12 points + 1 dropout, then plain and pick
    assert len(compare_quality.planned(args, "full")) == 4 + 2 * (12 + 1 + 2)
    assert compare_quality.print_plan(args) == (68, 0)
    # 8 runs of ours of 780 + 150 s, 60 of a peer of 900 + 150 s
    hours = (8 * 930 + 60 * 1050) / 3600
    assert f"plan: 68 trainings, 0 recorded, about {hours:.1f} h left" in capsys.readouterr().out
    # the second stage: the pick with ours' dropout, only where it differs
    best = {"point": PLAIN.to_json(), "dropout": 0.1}
    assert compare_quality.second_stage(args, best, 0.1) == []
    assert compare_quality.second_stage(args, best, 0.3) == [PLAIN._replace(dropout="ours")]
    assert GridPoint(**best["point"]).name == "lr0.001-w400-rsqrt-d0.1"


def test_our_recipe_is_read_at_the_runs_real_step_count(tmp_path):
    """The peers' warmup share and the dropout check use the step count the time budget chose
    (test.json), never config.yaml's provisional train.steps (issue 50: 192 of 960 = 20%
    where the 400 s runs warmed up over 192 of ~460 steps)."""
    from benchmarks.compare_quality import real_recipe
    from seq2seq.config import load_config, replace, save_config

    cfg = load_config(ROOT / "configs/tatoeba_en_es.yaml")
    cfg = replace(
        cfg,
        data=replace(cfg.data, max_tokens=2048),
        train=replace(cfg.train, steps=960, warmup_steps=192),
        model=replace(cfg.model, dropout_rate=0.3),
    )
    save_config(cfg, tmp_path / "config.yaml")
    (tmp_path / "test.json").write_text(json.dumps({"steps": 460, "step": 460}))
    r = real_recipe(tmp_path, words=119_584)  # small's target-side words
    assert r["steps"] == 460 and r["provisional_steps"] == 960 and r["warmup_steps"] == 192
    assert r["warmup_share"] == pytest.approx(192 / 460)
    # 0.02 × 460 × 2048 / 119,584 passes: 0.16, where the provisional 960 steps gave 0.3
    assert r["dropout"] == 0.3 and r["dropout_at_real_steps"] == 0.16
    (tmp_path / "test.json").unlink()
    with pytest.raises(RuntimeError, match="test.json: missing"):
        real_recipe(tmp_path, words=1)


@pytest.mark.parametrize("arch", ["pre", "post"])
def test_peers_have_ours_parameter_count_and_decode_as_their_forward(arch):
    """Each peer counts exactly ours' trainable parameters at the same sizes and norm
    placement; its step-by-step decoder gives the logits of its full forward (causal), and
    extra source padding changes nothing."""
    torch = pytest.importorskip("torch", reason="torch comes with the optional extra 'compare'")
    pytest.importorskip("transformers", reason="it comes with the optional extra 'compare'")
    import jax
    import numpy as np
    from flax import nnx

    from benchmarks.peers import build_peer, trainable_parameters
    from seq2seq.config import load_config, replace
    from seq2seq.model.positions import sinusoidal_embedding
    from seq2seq.model.transformer import Transformer

    m = replace(
        load_config(ROOT / "configs/tatoeba_en_es.yaml").model,
        d_model=32,
        d_ff=64,
        num_heads=2,
        num_encoder_layers=2,
        num_decoder_layers=2,
        vocab_size=50,
        norm=arch,
        dropout_rate=0.1,
    )
    ours = Transformer(m, rngs=nnx.Rngs(0))
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(ours, nnx.Param)))
    torch.manual_seed(0)
    peer = build_peer(arch, m, 50, 0.1, pad=0, bos=2, eos=3).eval()
    assert trainable_parameters(peer) == count
    src = torch.tensor([[5, 6, 7, 3], [8, 9, 3, 0]])
    dec = torch.tensor([[2, 10, 11, 12], [2, 13, 14, 0]])
    with torch.no_grad():
        full = peer(src, dec)
        memory, mask = peer.encode(src)
        for j in range(dec.shape[1]):
            step = peer.decode(memory, mask, dec[:, : j + 1])[:, -1]
            torch.testing.assert_close(step, full[:, j], atol=1e-5, rtol=1e-5)
            last = peer.decode(memory, mask, dec[:, : j + 1], last_only=True)  # beam search's
            assert last.shape == (2, 1, 50)
            torch.testing.assert_close(last[:, 0], full[:, j], atol=1e-5, rtol=1e-5)
        padded = torch.cat([src, torch.zeros(2, 3, dtype=torch.long)], dim=1)
        torch.testing.assert_close(peer(padded, dec), full, atol=1e-5, rtol=1e-5)
    if arch == "pre":  # ours' positions and one shared matrix
        want = np.asarray(sinusoidal_embedding(np.arange(20), 32))
        np.testing.assert_allclose(peer.positions[:20].numpy(), want, atol=1e-6)
        assert peer.target_embed is peer.embed and peer.output is None


def test_peer_beam_search_finds_the_best_scored_output_as_ours_defines_it():
    """With beams enough to keep every live prefix, the peers' beam search returns the
    output a brute-force search over all outputs scores best: Σ log p / ((5 + |Y|) / 6)^α,
    EOS counted, PAD and BOS banned, only EOS at each row's limit."""
    torch = pytest.importorskip("torch", reason="torch comes with the optional extra 'compare'")
    import itertools

    from benchmarks.peers import beam_search

    vocab, pad, bos, eos = 6, 0, 1, 2
    g = torch.Generator().manual_seed(0)
    w = torch.randn(vocab, vocab, generator=g) * 2
    w[:, eos] -= 2.5  # outputs longer than one token win sometimes
    u, v = torch.randn(8, vocab, generator=g), torch.randn(3, vocab, generator=g)

    class Toy:  # next-token logits from the last token, the position and the sentence
        def encode(self, src):
            return src.float(), src == pad

        def decode(self, memory, mask, dec_in, last_only=False):
            logits = w[dec_in] + u[: dec_in.shape[1]][None] + v[memory[:, 0].long()][:, None]
            return logits[:, -1:] if last_only else logits

    alpha = 0.6
    penalty = [((5 + n) / 6) ** alpha for n in range(10)]

    def brute(row, limit):
        best = (-float("inf"), None)
        for n in range(1, limit + 1):
            for body in itertools.product((3, 4, 5), repeat=n - 1):
                y = [*body, eos]
                logp = torch.log_softmax(
                    Toy().decode(torch.tensor([[row]]), None, torch.tensor([[bos, *y[:-1]]]))[0],
                    -1,
                )
                score = sum(logp[j, y[j]].item() for j in range(n)) / penalty[n]
                best = max(best, (score, y), key=lambda x: x[0])
        return best[1]

    src, limits = torch.tensor([[0, 5], [1, 5], [2, 5]]), [4, 3, 5]
    found = beam_search(
        Toy(), src, limits, beam=64, penalty=penalty, bos=bos, eos=eos, banned=[pad, bos]
    )
    assert found == [brute(r, n) for r, n in zip(range(3), limits)]
    assert [len(y) for y in found] != [1, 1, 1]  # not only the empty output
    narrow = beam_search(
        Toy(), src, limits, beam=2, penalty=penalty, bos=bos, eos=eos, banned=[pad, bos]
    )
    assert all(y[-1] == eos and len(y) <= n for y, n in zip(narrow, limits))


def test_pre_norm_peer_trains_and_translates_with_ours_settings(tmp_path):
    """``train_peer`` on 300 pairs for 2 s: the pre-norm peer updates, takes ours' dropout
    (``ours``), fixes its warmup from ours' share and translates every line."""
    pytest.importorskip("torch", reason="torch comes with the optional extra 'compare'")
    spm = pytest.importorskip("sentencepiece", reason="it comes with the optional extra")
    from benchmarks.compare_quality import read_lines
    from benchmarks.peers import GridPoint, PeerSetup, train_peer
    from seq2seq.config import load_config

    en = read_lines(ROOT / "data/tatoeba-en-es/train.en")[:300]
    es = read_lines(ROOT / "data/tatoeba-en-es/train.es")[:300]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(en + es),
        model_prefix=str(tmp_path / "spm"),
        vocab_size=150,
        hard_vocab_limit=False,
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        minloglevel=2,
    )
    cfg = load_config(
        ROOT / "configs/tatoeba_en_es.yaml",
        ["model.d_model=32", "model.d_ff=64", "model.num_heads=2", "model.dropout_rate=0.2"]
        + ["decode.max_len_a=0.3", "decode.max_len_b=3"],  # short: untrained, it never stops
    )
    setup = PeerSetup(cfg, tmp_path / "spm.model", warmup_share=0.25)
    point = GridPoint(1e-3, "ours", "linear", "ours")
    r = train_peer("pre", setup, (en, es), {"test": en[:7]}, 2.0, 2, 1, point)
    assert r["steps"] >= 1 and r["dropout"] == 0.2 and r["warmup_steps"] >= 1
    # linear: it stops at the end fixed after the warmup, or when the 2 s are up first
    if r["horizon"] is None:
        assert r["train_seconds"] >= 2.0 and r["steps"] < r["warmup_steps"]
    else:
        assert r["steps"] == r["horizon"] or r["train_seconds"] >= 2.0
        assert r["warmup_steps"] <= r["steps"] <= r["horizon"]
    assert len(r["hyps"]["test"]) == 7 and all(isinstance(h, str) for h in r["hyps"]["test"])


@pytest.mark.slow  # ~1 min: the tiny preset's three programs on each side
def test_step_profile_times_nested_programs_of_both_sides(tmp_path):
    """``benchmarks/profile_step.py``: on each side the forward alone takes less than the whole
    step that contains it (the programs are nested as the phases assume)."""
    for name in ("torch", "transformers", "ctranslate2"):
        pytest.importorskip(name, reason=f"{name} comes with the optional extra 'compare'")
    from benchmarks import profile_step

    result = profile_step.profile("tiny", calls=1, threads=2, directory=tmp_path)
    for side in ("ours", "pytorch"):
        assert 0 < result[side]["forward"] < result[side]["step"], result[side]
