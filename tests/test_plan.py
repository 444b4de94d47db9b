"""``seq2seq-plan``: the train step compiled for compile-only TPU devices (libtpu) tells the
truth about what cannot silently change: parameter bytes per device, the collectives data and
fsdp parallelism need, FLOPs against the analytic count, and a config that cannot fit.

libtpu comes from the ``tpu`` extra, or, as ``.ci/run`` installs it, from a directory named
by ``TPU_LIBRARY_PATH`` (the test venv then keeps no libtpu for the other tests to probe); the
TPU tests skip, with that reason, where neither is there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from seq2seq import plan
from seq2seq.config import load_config
from seq2seq.resolve import resolve_config
from seq2seq.training.context import train_context
from seq2seq.training.step import train_size, train_spec

ROOT = Path(__file__).resolve().parent.parent
CI_LIBTPU = ROOT / ".venv" / "libtpu" / "libtpu" / "libtpu.so"  # where .ci/run puts it
if "TPU_LIBRARY_PATH" not in os.environ and CI_LIBTPU.is_file():
    os.environ["TPU_LIBRARY_PATH"] = str(CI_LIBTPU)
HAVE_LIBTPU = bool(os.environ.get("TPU_LIBRARY_PATH")) or importlib.util.find_spec("libtpu")
needs_libtpu = pytest.mark.skipif(
    not HAVE_LIBTPU,
    reason="libtpu is not installed (pip install -e '.[tpu]', or TPU_LIBRARY_PATH=.../libtpu.so)",
)
# a model small enough to compile in seconds, with every kind of parameter; its matrices
# split over 2 × 2 devices are whole TPU tiles (multiples of 8 × 128), so no padding hides
# in the bytes
TINY = [
    "model.d_model=256",
    "model.num_heads=4",
    "model.d_ff=512",
    "model.num_encoder_layers=1",
    "model.num_decoder_layers=1",
    "model.vocab_size=1024",
    "data.max_len=32",
    "data.max_tokens=1024",
    "train.time_budget=0",
    "train.steps=10",
    "decode.max_tokens=512",
]


def config(*overrides: str, path: str = "configs/tatoeba_en_es.yaml"):
    return resolve_config(load_config(ROOT / path, list(overrides)), validate=False).config


def parameters(c) -> int:
    """The model's parameter count, from its abstract train state (nothing compiled)."""
    return train_size(train_spec(c).abstract).parameters


def shards(sharding) -> int:
    """Devices an array is split over."""
    return int(np.prod([sharding.mesh.shape[a] for e in sharding.spec if e for a in
                        (e if isinstance(e, tuple) else (e,))]))  # fmt: skip


def test_collectives_are_read_from_hlo_text_with_loops_and_async_pairs():
    hlo = """HloModule m, is_scheduled=true

%body.1 (p: (s32[], f32[64,128])) -> (s32[], f32[64,128]) {
  %x = f32[64,128]{1,0} parameter(0)
  %ar = f32[64,128]{1,0} all-reduce(%x), channel_id=1, to_apply=%add
  ROOT %t = (s32[], f32[64,128]) tuple(%c, %ar)
}

ENTRY %main.2 (a: bf16[8,256]) -> bf16[64,256] {
  %a = bf16[8,256]{1,0} parameter(0)
  %ags = (bf16[8,256]{1,0}, bf16[64,256]{1,0}) all-gather-start(%a), dimensions={0}
  %agd = bf16[64,256]{1,0} all-gather-done(%ags)
  %w = (s32[], f32[64,128]) while(%init), condition=%cond.1, body=%body.1
  %rs = bf16[8,256]{1,0} reduce-scatter(%agd), dimensions={0}, to_apply=%add
  ROOT %ar2 = (f32[256,4000]{0,1:T(8,128)}, /*index=1*/f32[16]{0}) all-reduce(%u, %v), to_apply=%add
}
"""
    found = {c["kind"]: c for c in plan.collectives(hlo)}
    # a combined all-reduce moves every array of its tuple
    ar = 64 * 128 * 4 + 256 * 4000 * 4 + 16 * 4
    assert found["all-reduce"] == {"kind": "all-reduce", "count": 2, "bytes": ar, "in_loop": 1}
    # the async pair once, its gathered result's bytes
    assert found["all-gather"] == {
        "kind": "all-gather",
        "count": 1,
        "bytes": 64 * 256 * 2,
        "in_loop": 0,
    }
    assert found["reduce-scatter"]["bytes"] == 8 * 256 * 2


def test_collectives_per_step_count_a_loop_body_once_per_micro_batch():
    c = plan.Compiled(
        collectives=[
            {"kind": "all-reduce", "count": 3, "bytes": 300, "in_loop": 2},
            {"kind": "all-gather", "count": 1, "bytes": 50, "in_loop": 0},
        ]
    )
    # 1 outside the loop + 2 inside × 4 trips, 100 bytes each
    assert plan.collectives_per_step(c, 4) == {"all-reduce": (9, 900.0), "all-gather": (1, 50.0)}
    d = plan.Device("x", 1e9, 1.0, 1e12, 1e9, 1e3, "test")
    assert plan.roofline_seconds(c, d, 4) == pytest.approx((2 * 900 + 50) / 1e3)


def test_h200_target_config_is_h100s_with_its_memory():
    h100 = plan.gpu_target_config("h100").splitlines()
    h200 = plan.gpu_target_config("h200").splitlines()
    changed = {a.split(":")[0].strip(): b.split(":")[1].strip()
               for a, b in zip(h100, h200, strict=True) if a != b}  # fmt: skip
    assert changed == {"memory_bandwidth": "4800000000000", "device_memory_size": "151397597184"}
    assert plan.TARGETS["h200x8"].figures.memory == 141e9


def test_micro_batch_splits_keep_the_tokens_per_step_and_whole_rows_per_device():
    c = config(*TINY)  # 32 rows of 32 tokens
    assert plan.micro_batch_options(c, 8) == [1, 2, 4]
    split = plan.with_micro_batches(c, 4)
    assert (split.data.max_tokens, split.train.grad_accum_steps) == (256, 4)
    assert (8, 1, 1) in plan.meshes(c, 8) and (1, 1, 8) not in plan.meshes(c, 8)  # 4 heads


@needs_libtpu
def test_tiny_preset_on_a_v5e_8_mesh_of_data_fsdp_and_tensor():
    c = config(*TINY, "mesh.data=2", "mesh.fsdp=2", "mesh.tensor=2")
    p = plan.plan(c, "tpu-v5e-8")
    assert p.mesh == (2, 2, 2) and p.fits and not p.train.error
    # the state's bytes per device: each leaf ÷ the devices it is split over, as the
    # partitioner's shardings say; the total ÷ fsdp × tensor bounds it from below (small
    # tensors split over fewer axes, or replicated, add the rest)
    ctx = train_context(c, plan.partitioner_for(c, plan.compile_only_devices(p.target)))
    leaves = jax.tree.leaves(ctx.abstract)
    total = sum(x.size * x.dtype.itemsize for x in leaves)
    expected = sum(
        x.size * x.dtype.itemsize / shards(s)
        for x, s in zip(leaves, jax.tree.leaves(ctx.shardings))
    )
    assert total / 4 < expected < total / 4 * 1.01
    # the donated state as compiled: what the shardings say, up to a padded row of 128
    # float32 per small tensor (vectors, scalars)
    small = sum(x.ndim <= 1 for x in leaves)
    assert 0 <= p.train.alias - expected <= 512 * small
    assert p.train.argument > p.train.alias  # and the batch
    kinds = {x["kind"] for x in p.train.collectives}
    assert "all-gather" in kinds  # fsdp: parameters gathered where used
    assert kinds & {"all-reduce", "reduce-scatter"}  # data × fsdp: gradients summed
    # XLA counts what the analytic count leaves out (softmax, norms, loss, the update)
    assert 1.0 < p.flops_per_step / p.analytic_flops < 1.25  # 1.15 with libtpu 0.0.42
    assert p.decode is not None and p.decode.peak > 0 and p.decode_shape[0] % 4 == 0
    assert p.step_seconds > 0 and p.to_json()["fits"] is True


@needs_libtpu
def test_a_config_that_cannot_fit_is_reported_as_not_fitting():
    # 4M-entry vocabulary × 1024 wide, replicated (data parallel): parameters and Adam
    # moments need 4 · 3 · 4.2e9 bytes per device, a v5e has 16 GB
    c = config(*TINY, "model.vocab_size=4194304", "model.d_model=1024", "model.num_heads=8")
    p = plan.plan(c, "tpu-v5e-8", decode=False)
    assert not p.fits and p.headroom < 0
    assert p.train.error and "RESOURCE_EXHAUSTED" in p.train.error
    assert p.train.peak > 16e9


@needs_libtpu
def test_plan_command_writes_json(tmp_path, capsys):
    from seq2seq.cli import plan_main

    out = tmp_path / "plan.json"
    args = ["--config", str(ROOT / "configs/tatoeba_en_es.yaml"), *TINY, "mesh.fsdp=8"]
    args += ["mesh.data=1", "--target", "tpu-v5p-8", "--json", str(out)]
    assert plan_main(args) == 2  # a v5p-8 has 4 chips: fsdp=8 cannot be laid out
    assert "needs 8 devices but there are 4" in capsys.readouterr().err
    args[args.index("mesh.fsdp=8")] = "mesh.fsdp=4"
    assert plan_main(args) == 0
    r = json.loads(out.read_text())
    assert r["fits"] and r["plan"]["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
    for key in ("peak_bytes", "device_memory", "xla_flops", "analytic_flops", "step_seconds"):
        assert r["plan"][key] > 0
    assert "predicted step ≥" in capsys.readouterr().out


@needs_libtpu
@pytest.mark.slow
def test_transformer_base_on_v5e_8_flops_and_memory():
    # Transformer base at 4,096 tokens a step (32 rows, 4 per chip) instead of its 32,768: the
    # state's bytes do not depend on the batch, and the compile takes a third of the time
    c = config("data.max_tokens=4096", path="configs/transformer_base.yaml")
    p = plan.plan(c, "tpu-v5e-8", decode=False)
    assert p.fits and p.mesh == (8, 1, 1)
    # 63.1M parameters (65M in Vaswani et al. 2017, Table 3, with a 37k vocabulary), float32,
    # with Adam's two moments, replicated by data parallelism
    n = parameters(c)
    assert n == pytest.approx(63.1e6, rel=0.01)
    assert p.train.alias == pytest.approx(3 * 4 * n, rel=0.01)
    assert 1.0 < p.flops_per_step / p.analytic_flops < 1.10
    assert {x["kind"] for x in p.train.collectives} & {"all-reduce", "reduce-scatter"}


@needs_libtpu
@pytest.mark.slow
def test_search_finds_a_mesh_where_the_default_does_not_fit():
    # replicated over a v5p-8's 4 chips (the default, data parallel) the 4M × 2048 embedding
    # and its Adam moments need 101 GB per device of 95; split over fsdp or tensor they fit
    c = config(*TINY, "model.vocab_size=4194304", "model.d_model=2048", "model.num_heads=8")
    found = plan.search(c, "tpu-v5p-8", max_micro_batches=2)
    assert found.default is not None and found.default.mesh == (4, 1, 1)
    assert not found.default.fits
    assert found.ranked and all(p.fits for _, p in found.ranked)
    best = found.ranked[0][1]
    assert best.mesh[1] * best.mesh[2] > 1 and best.decode is not None
    times = [p.step_seconds for _, p in found.ranked]
    assert times == sorted(times)
    assert "chosen: mesh.data=" in plan.format_search(found)


@pytest.mark.skipif(
    importlib.util.find_spec("jax_cuda12_plugin") is None,
    reason="jax_cuda12_plugin is not installed (pip install -e '.[cuda12]')",
)
def test_cuda_target_compiles_without_a_gpu(tmp_path):
    # the command as a user runs it (no JAX_PLATFORMS in the environment): it must keep the
    # CUDA plugin from starting on a machine without a driver
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    out = tmp_path / "plan.json"
    cmd = [sys.executable, "-m", "seq2seq", "plan", "--config", "configs/tatoeba_en_es.yaml"]
    cmd += [*TINY, "--target", "h200x8", "--json", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    r = json.loads(out.read_text())["plan"]
    assert r["fits"] and r["devices"] == 8 and r["usable_memory"] == 0.75 * 141e9
    p = plan.plan(config(*TINY), "h100x8", decode=False)
    assert p.devices == 8 and p.fits and p.train.peak > 0
    # no cost analysis for a compile-only GPU program: the unpartitioned one's, ÷ 8
    assert p.train.cost_source == "unpartitioned"
    assert 1.0 < p.flops_per_step / p.analytic_flops < 1.25  # 1.04 with jaxlib 0.10.2
    assert {x["kind"] for x in p.train.collectives} & {"all-reduce", "reduce-scatter"}


def test_scaling_page_table_is_the_plan_records():
    # docs/scaling.md's plan table is generated from docs/data/plan/: regenerated from the
    # committed records it is unchanged, one row per record, each searched on its target
    from benchmarks import plan_shipped

    records = plan_shipped.load_records()
    assert ("tatoeba_en_es", "tpu-v5e-8") in records
    for (key, target), r in records.items():
        assert r["plan"]["target"] == target and r["default"]["target"] == target
        assert r["command"].startswith(f"seq2seq-plan --config {plan_shipped.CONFIGS[key][0]}")
        ranked = [p["step_seconds"] for p in r["search"]]
        assert ranked == sorted(ranked) and all(p["fits"] for p in r["search"])
    text = plan_shipped.table(records)
    page = plan_shipped.DOCS.read_text(encoding="utf-8")
    block = page.split(plan_shipped.BEGIN + "\n", 1)[1].split("\n" + plan_shipped.END, 1)[0]
    assert block == text
    assert len([ln for ln in text.splitlines() if ln.startswith("| `")]) == len(records)
