"""scripts/compare.py on tiny shapes (``--smoke``): the peers build, convert and run beside ours,
and the JSON and the table have their layout. Speed is not asserted here (docs/benchmarks.md)."""

import json
import os
import random
import subprocess
import sys
import time
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
        [sys.executable, "scripts/compare.py", "--smoke"],
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
            "scripts/compare.py",
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
    assert text.startswith(f"before\n{BEGIN}\nMeasured by `scripts/compare.py`")
    assert text.endswith(f"{END}\nafter\n") and "old table" not in text
    assert "ours float32 against PyTorch float32" in text and "bfloat16 autocast" in text
    for variant in ("smoke float32", "smoke bfloat16"):
        assert f"| {variant} | beam 4 | sentences/s |" in text
        assert f"| {variant} | training |" in text


def test_pytorch_autocast_runs_its_matmuls_in_bfloat16():
    """The bfloat16 row's peer really computes in bfloat16 (autocast), the float32 row's not."""
    torch = pytest.importorskip("torch", reason="torch comes with the optional extra 'compare'")
    sys.path.insert(0, str(ROOT / "scripts"))
    from compare import Marian

    layer = torch.nn.Linear(4, 4)
    x = torch.ones(2, 4)
    with Marian.autocast("bfloat16"):
        assert layer(x).dtype == torch.bfloat16
    with Marian.autocast("float32"):
        assert layer(x).dtype == torch.float32


def test_joined_pairs_stay_aligned_and_use_every_line():
    sys.path.insert(0, str(ROOT / "scripts"))
    from compare_quality import join_consecutive

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
    sys.path.insert(0, str(ROOT / "scripts"))
    from compare_quality import PROXIES, carve_heldout, proxy_splits, sentence_key

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


def test_tuned_schedule_warms_up_then_decays_to_zero_at_the_fixed_end():
    sys.path.insert(0, str(ROOT / "scripts"))
    from compare_quality import tuned_horizon, tuned_rate, tuned_warmup

    peak, warmup, end = 2e-3, 10, 50
    assert tuned_rate(0, peak, warmup, None) == pytest.approx(peak / warmup)
    assert tuned_rate(4, peak, warmup, None) == pytest.approx(peak / 2)
    assert tuned_rate(warmup - 1, peak, warmup, end) == pytest.approx(peak)  # the W-th update
    assert tuned_rate(30, peak, warmup, None) == peak  # before the end is fixed
    rates = [tuned_rate(c, peak, warmup, end) for c in range(warmup - 1, end + 3)]
    steps = [a - b for a, b in zip(rates, rates[1:])]
    assert steps[: end - warmup + 1] == pytest.approx(
        [peak / (end - warmup + 1)] * (end - warmup + 1)
    )
    assert rates[end - warmup + 1 :] == [0.0, 0.0, 0.0]  # zero from the end on
    assert tuned_rate(end - 1, peak, warmup, end) == pytest.approx(peak / (end - warmup + 1))
    # the warmup: a fifth of the updates that fit after the probe (10 passes in 2 s: 5/s)
    assert tuned_warmup(0.2, 10, 2.0, 100.0) == round(0.2 * 98 * 5)
    assert tuned_warmup(0.2, 10, 200.0, 100.0) == 1  # no time left: at least one step
    # the end: 20 updates in 10 s after the probe (2/s), 88 s left of 100
    assert tuned_horizon(20, 12.0, 2.0, 100.0) == 20 + 176
    assert tuned_horizon(20, 120.0, 2.0, 100.0) == 20  # the budget is spent: end here


@pytest.mark.slow  # ~3 min on 2 cores: 2 seeds × (ours, peer, 2 tuned candidates or 1)
def test_quality_comparison_runs_three_systems_and_seeds_and_resumes(tmp_path):
    for name in ("torch", "transformers", "sentencepiece"):
        pytest.importorskip(name, reason=f"{name} comes with the optional extra 'compare'")
    out, docs = tmp_path / "quality.json", tmp_path / "benchmarks.md"
    docs.write_text(
        "x\n<!-- compare.py quality: begin -->\nold\n<!-- compare.py quality: end -->\ny\n"
    )
    tiny = "model.d_model=32 model.d_ff=64 model.num_heads=2 model.num_encoder_layers=1 "
    tiny += "model.num_decoder_layers=1 tokenizer.vocab_size=200 train.steps=3 "
    tiny += "train.eval_every=3 train.time_budget=0"
    # short output limits: the untrained models never stop early (peer-tuned decodes as ours)
    tiny += " decode.max_len_a=0.3 decode.max_len_b=3"
    sets = [a for kv in tiny.split() for a in ("--set", kv)]
    argv = [sys.executable, "scripts/compare.py", "--quality", "--proxies", "long"]
    argv += ["--limit-lines", "60", "--out", str(tmp_path / "q"), "--json", str(out)]
    argv += ["--seeds", "1,2", "--peer-lrs", "1e-3,3e-3", "--peer-seconds", "3"]
    argv += ["--docs", str(docs), *sets]

    def run():
        start = time.perf_counter()
        proc = subprocess.run(
            argv, cwd=ROOT, env={**os.environ, **FAST_XLA}, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        return proc.stdout, time.perf_counter() - start

    first, first_seconds = run()
    result = json.loads(out.read_text())
    r = result["proxies"]["long"]
    assert r["train_pairs"] == 60 and r["test_lines"] == 60
    assert set(r["runs"]) == {"ours", "peer", "peer-tuned"}
    for system, runs in r["runs"].items():
        assert set(runs) == {"1", "2"}, system
    for seed in ("1", "2"):
        ours, peer = r["runs"]["ours"][seed], r["runs"]["peer"][seed]
        tuned = r["runs"]["peer-tuned"][seed]
        assert ours["step"] == 3 and peer["steps"] >= 1 and tuned["steps"] >= 1
        # the plain peer trains at least our time and --peer-seconds; the tuned one until its
        # fixed end or that time
        assert peer["train_seconds"] >= max(ours["train_seconds"], 3.0)
        assert tuned["steps"] == tuned["horizon"] or tuned["train_seconds"] >= 3.0
        assert tuned["recipe"]["learning_rate"] == r["picked_learning_rate"]
        c = r["comparisons"][seed]
        assert c["baseline"] == "ours" and c["num_sentences"] == 60
        assert [s["name"] for s in c["systems"]] == ["ours", "peer", "peer-tuned"]
        for s in c["systems"]:
            for metric in ("BLEU", "chrF"):
                m = s[metric]
                assert 0 <= m["score"] <= 100 and m["ci95"] >= 0
                if s["name"] != "ours":
                    assert 0 <= m["p_bootstrap"] <= 1 and 0 <= m["p_ar"] <= 1
        assert c["signatures"]["BLEU"]["bootstrap"].startswith("nrefs:1|bs:1000|seed:12345")
    dev = r["dev_bleu_by_learning_rate"]
    assert set(dev) == {"0.001", "0.003"}
    assert r["picked_learning_rate"] in (1e-3, 3e-3)
    assert dev[f"{r['picked_learning_rate']:g}"] == max(dev.values())
    h = result["meta"]["heldout"]
    assert h["salt"] == "quality-heldout" and h["sets"]["long"]["pairs"] >= 2000
    text = docs.read_text()
    assert "old" not in text and "| long | peer-tuned | 60 | 60 |" in text
    assert "made on dev only" in text and text.endswith("end -->\ny\n")

    second, second_seconds = run()  # the same --out: every run is reused
    assert second.count("skip ") == 7 and "peer step" not in second
    assert json.loads(out.read_text())["proxies"]["long"]["comparisons"] == r["comparisons"]
    assert second_seconds < first_seconds / 2


def test_quality_options_are_checked(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "scripts"))
    import compare
    import compare_quality

    for argv, message in (
        (["--proxies", "full,tiny"], "--proxies: unknown proxy 'tiny'"),
        (["--seeds", "1"], "--seeds 1: needs at least 2 values"),
        (["--seeds", "1,1"], "--seeds 1,1: a value is repeated"),
        (["--peer-lrs", "1e-3"], "--peer-lrs 1e-3: needs at least 2 values"),
        (["--peer-lrs", "1e-3,x"], "--peer-lrs 1e-3,x: not a comma-separated list"),
        (["--corpus", str(tmp_path)], "train.en[.gz] is missing"),
        (["--config", "nowhere.yaml"], "--config nowhere.yaml"),
        (["--test-pairs", "50000"], "--test-pairs 50000: the 108126 groups of at most 8"),
    ):
        args = compare.parse_args(["--quality", "--out", str(tmp_path / "q"), *argv])
        assert compare_quality.run(args, "machine", compare.write_docs) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert not (tmp_path / "q").exists()  # nothing was started


@pytest.mark.slow  # ~1 min: the tiny preset's three programs on each side
def test_step_profile_times_nested_programs_of_both_sides(tmp_path):
    """``scripts/profile_step.py``: on each side the forward alone takes less than the whole
    step that contains it (the programs are nested as the phases assume)."""
    for name in ("torch", "transformers", "ctranslate2"):
        pytest.importorskip(name, reason=f"{name} comes with the optional extra 'compare'")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import profile_step

    result = profile_step.profile("tiny", calls=1, threads=2, directory=tmp_path)
    for side in ("ours", "pytorch"):
        assert 0 < result[side]["forward"] < result[side]["step"], result[side]
