"""benchmarks/benchmark.py runs end to end on tiny shapes (``--smoke``) and emits every field.

Speed and memory goals are not asserted here (they live in docs/benchmarks.md and issue #8);
this only checks that the script works and that its JSON has the documented layout.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TRAIN_FIELDS = (
    "model",
    "parameters",
    "matmul_parameters",
    "batch_shape",
    "step_seconds",
    "tokens_per_second",
    "target_tokens_per_second",
    "real_target_tokens_per_second",
    "compile_seconds",
    "compilations",
    "model_flops_per_step",
    "model_flops_breakdown",
    "xla_flops_per_step",
    "xla_over_model_flops",
    "achieved_gflops_per_second",
    "peak_gflops_per_second",
    "mfu",
    "config",
)
FIXED_TRAIN_FIELDS = ("goal_mfu", "goal_met")
PIPELINE_FIELDS = (
    "batches_checked",
    "distinct_batch_shapes",
    "real_token_share",
    "epoch_real_token_share",
    "host_batch_seconds",
    "goal_met",
)
TEST_DECODE_FIELDS = (
    "sentences",
    "beam_size",
    "seconds",
    "compile_seconds",
    "compilations",
    "seconds_with_compile",
    "sentences_per_second",
    "output_tokens_per_second",
    "mean_output_tokens",
)
KV_FIELDS = (
    "kv_cache_seconds",
    "no_cache_seconds",
    "speedup",
    "same_output_share",
    "kv_cache_compilations_while_timed",
    "no_cache_compilations_while_timed",
)
FIXED_DECODE_FIELDS = (
    "sentences",
    "sentences_per_second",
    "compile_seconds",
    "eos_suppressed",
    "all_outputs_exact_length",
    "beam_size",
)
DATA_FIELDS = (
    "time_to_first_batch_new_run_seconds",
    "time_to_first_batch_cached_seconds",
    "tokenize_sentences_per_second",
    "tokenize_sentences",
)
MEMORY_FIELDS = (
    "phase",
    "baseline_rss_bytes",
    "setup_rss_bytes",
    "peak_rss_bytes",
    "device_memory",
)
MACHINE_FIELDS = (
    "cpu",
    "cpu_count",
    "jax",
    "backend",
    "device_kind",
    "dtype",
    "load_average_start",
    "load_average_end",
)
SPREAD = ("median", "min", "max", "n")


def _has(d, keys, where):
    missing = [k for k in keys if k not in d]
    assert not missing, f"{where}: missing {missing}"


def _smoke_run(tmp_path, *args):
    """``python -m benchmarks.benchmark --smoke *args``: its JSON and its stdout (it must exit
    0)."""
    out = tmp_path / "bench.json"
    # Unoptimised XLA code compiles about twice as fast; a smoke run measures nothing.
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.benchmark", "--smoke", *args, "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text()), proc.stdout


@pytest.mark.slow
def test_smoke_run_emits_every_field(tmp_path):
    r, _ = _smoke_run(tmp_path)

    _has(
        r,
        (
            "meta",
            "peak",
            "data",
            "train",
            "decode",
            "attention",
            "memory",
            "goals",
            "preset_config",
        ),
        "top level",
    )
    _has(r["meta"]["machine"], MACHINE_FIELDS, "meta.machine")
    _has(r["peak"]["gflops_per_second"], SPREAD, "peak")
    _has(r["data"], DATA_FIELDS, "data")

    assert set(r["train"]) == {"tatoeba", "tiny", "base"}
    for name, t in r["train"].items():
        _has(t, TRAIN_FIELDS, f"train.{name}")
        _has(t["step_seconds"], SPREAD, f"train.{name}.step_seconds")
        assert t["step_seconds"]["n"] == 2 and t["mfu"] > 0
        assert t["compilations"]["backend_compiles_during_steps"] == 0
        assert 0.9 < t["xla_over_model_flops"] < 2.0
    _has(r["train"]["tatoeba"]["pipeline"], PIPELINE_FIELDS, "train.tatoeba.pipeline")
    assert r["train"]["tatoeba"]["pipeline"]["distinct_batch_shapes"] == 1
    for name in ("tiny", "base"):
        _has(r["train"][name], FIXED_TRAIN_FIELDS, f"train.{name}")

    d = r["decode"]
    assert set(d["test_split"]) == {"beam1", "beam4"}
    for name, t in d["test_split"].items():
        _has(t, TEST_DECODE_FIELDS, f"decode.test_split.{name}")
    _has(d["kv_cache"], KV_FIELDS, "decode.kv_cache")
    assert d["kv_cache"]["same_output_share"] == 1.0
    assert d["kv_cache"]["kv_cache_compilations_while_timed"] == 0
    assert d["kv_cache"]["no_cache_compilations_while_timed"] == 0
    if importlib.util.find_spec("ctranslate2") is not None:  # the export extra is installed
        for compute in ("float32", "int8"):
            ct2 = d["ctranslate2"][compute]
            assert ct2["sentences"] == t["sentences"] and ct2["sentences_per_second"] > 0
    for key in ("fixed", "fixed_greedy"):
        for name in ("tiny", "base"):
            _has(d[key][name], FIXED_DECODE_FIELDS, f"decode.{key}.{name}")
            assert d[key][name]["all_outputs_exact_length"]

    a = r["attention"]
    assert len(a["lengths"]) == 2
    for n, row in a["lengths"].items():
        for path in ("default", "chunked"):
            assert row[path]["temp_bytes"] > 0, (n, path, row[path])
    assert a["chunked_check"]["max_abs_diff"] < 1e-4

    for phase in ("train", "decode"):
        _has(r["memory"][phase], MEMORY_FIELDS, f"memory.{phase}")
        assert r["memory"][phase]["peak_rss_bytes"] > 0


@pytest.mark.slow
def test_bfloat16_operands_report_both_peaks(tmp_path):
    """With bfloat16 matmul operands, MFU is against the bfloat16 peak and the same step is
    also put against the float32 peak of the same run (what a float32 step is held to)."""
    r, stdout = _smoke_run(
        tmp_path, "--only", "train", "--preset", "tiny", "--matmul-dtype", "bfloat16"
    )
    assert r["peak"]["dtype"] == "bfloat16" and r["float32_peak"]["dtype"] == "float32"
    t = r["train"]["tiny"]
    achieved = t["achieved_gflops_per_second"]
    peak = r["peak"]["gflops_per_second"]["median"]
    f32 = r["float32_peak"]["gflops_per_second"]["median"]
    assert t["mfu"] == pytest.approx(achieved / peak)
    assert t["of_float32_peak"] == pytest.approx(achieved / f32)
    assert "of float32)" in stdout


def test_flop_formula_by_hand():
    from seq2seq.config import ModelConfig
    from seq2seq.model.flops import train_flops_breakdown, train_flops_per_step

    cfg = ModelConfig(
        vocab_size=100, d_model=8, num_heads=2, num_encoder_layers=2, num_decoder_layers=1, d_ff=16
    )
    b, s, t = 3, 5, 4
    d, f, v = 8, 16, 100
    per_src = 6 * (2 * (4 * d * d + 2 * d * f) + 2 * 2 * s * d + 1 * 2 * d * d)
    per_tgt = 6 * (1 * (6 * d * d + 2 * d * f) + 2 * t * d + 2 * s * d + d * v)
    got = train_flops_breakdown(cfg, b, s, t)
    assert got["per_source_token"] == per_src and got["per_target_token"] == per_tgt
    assert train_flops_per_step(cfg, b, s, t) == b * s * per_src + b * t * per_tgt
    summaries = ("per_source_token", "per_target_token", "total")
    parts = sum(v for k, v in got.items() if k not in summaries)
    assert parts == got["total"]
