"""scripts/compare.py on tiny shapes (``--smoke``): the peers build, convert and run beside ours,
and the JSON and the table have their layout. Speed is not asserted here (docs/benchmarks.md)."""

import json
import os
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


@pytest.mark.slow
def test_quality_comparison_runs_both_systems_on_a_proxy(tmp_path):
    for name in ("torch", "transformers"):
        pytest.importorskip(name, reason=f"{name} comes with the optional extra 'compare'")
    out, docs = tmp_path / "quality.json", tmp_path / "benchmarks.md"
    docs.write_text(
        "x\n<!-- compare.py quality: begin -->\nold\n<!-- compare.py quality: end -->\ny\n"
    )
    tiny = "model.d_model=32 model.d_ff=64 model.num_heads=2 model.num_encoder_layers=1 "
    tiny += "model.num_decoder_layers=1 tokenizer.vocab_size=200 train.steps=3 train.eval_every=3"
    sets = [a for kv in tiny.split() for a in ("--set", kv)]
    proc = subprocess.run(
        [sys.executable, "scripts/compare.py", "--quality", "--proxies", "long"]
        + ["--limit-lines", "150", "--out", str(tmp_path / "q"), "--json", str(out)]
        + ["--peer-seconds", "4"]
        + ["--docs", str(docs), *sets],
        cwd=ROOT,
        env={**os.environ, **FAST_XLA},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())["proxies"]["long"]
    ours, peer = r["ours"], r["peer"]
    assert r["train_pairs"] == 150 and ours["step"] == 3 and peer["steps"] >= 1
    # the peer trained for our training time, or --peer-seconds where that is longer (it
    # stops after the step that crosses it)
    assert peer["train_seconds"] >= max(ours["train_seconds"], 4.0)
    for side in (ours, peer):
        assert 0 <= side["test_bleu"] <= 100 and 0 <= side["test_chrf"] <= 100
        assert side["bleu_signature"].startswith("nrefs:1|case:mixed")
    text = docs.read_text()
    assert "old" not in text and "| long | 150 |" in text and text.endswith("end -->\ny\n")


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
