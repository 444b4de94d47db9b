"""Proofs on fake CPU devices: a mesh computes what one device computes.

Every multi-device run happens in a subprocess (tests/sharding_worker.py) with
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` set only there, so the flag never
reaches this pytest process. The worker writes JSON/npz results; the assertions are here.
Tolerance: atol 1e-5 in float32 for losses, gradients and parameters.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import write_split
from tiny_run import xla_flags

from seq2seq.config import MeshConfig
from seq2seq.sharding import Partitioner, make_mesh
from seq2seq.training.checkpoints import Checkpointer

WORKER = Path(__file__).resolve().parent / "sharding_worker.py"
ATOL = 1e-5
MESHES = ["8x1x1", "2x4x1", "2x2x2", "1x1x8"]

pytestmark = pytest.mark.slow


def _env(devices: int | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = xla_flags(devices)
    return env


def _worker(mode: str, out: Path, devices: int | None, *extra: str, timeout: int = 900) -> None:
    proc = subprocess.run(
        [sys.executable, str(WORKER), mode, "--out", str(out), *extra],
        env=_env(devices),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"{mode} worker failed:\n{proc.stderr[-4000:]}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One 8-device run: the single-device reference and the four meshes."""
    out = tmp_path_factory.mktemp("sharding")
    _worker("meshes", out, 8)
    return out, json.loads((out / "meshes.json").read_text())


def _npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return dict(f)


def _assert_same_params(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys() and len(a) > 30
    for k in a:
        np.testing.assert_allclose(a[k], b[k], atol=ATOL, rtol=0, err_msg=k)


@pytest.mark.parametrize("mesh", MESHES)
def test_train_steps_on_a_mesh_equal_one_device(runs, mesh):
    _, r = runs
    ref, got = r["reference"], r["meshes"][mesh]
    assert len(got["loss"]) == 3 and ref["loss"][0] > 3.0  # ~log(40): a real loss
    np.testing.assert_allclose(got["loss"], ref["loss"], atol=ATOL, rtol=0)
    np.testing.assert_allclose(got["grad_norm"], ref["grad_norm"], atol=ATOL, rtol=0)
    # gradients of every step (from Adam's first moment), the second moments, the parameters
    assert got["grad_diff"] < ATOL and got["grad_scale"] > 1e-2
    assert got["moment_diff"] < ATOL
    assert got["param_diff"] < ATOL and got["param_change"] > 1e-3  # parameters did move
    rows = 16 // (int(mesh.split("x")[0]) * int(mesh.split("x")[1]))
    assert got["batch_shard_shape"] == [rows, 16]  # each device holds only its rows


def test_parameters_are_sharded_as_the_rules_say(runs):
    _, r = runs
    m = r["meshes"]
    # (8,1,1): pure data parallel, every array whole on every device
    assert all(spec == [] for spec in m["8x1x1"]["specs"].values())
    assert m["8x1x1"]["shard_shapes"]["embedding"] == [40, 32]
    # (2,4,1): FSDP splits d_model four ways, in the parameters and in Adam's moments
    s, shapes = m["2x4x1"]["specs"], m["2x4x1"]["shard_shapes"]
    assert s["embedding"] == [None, "fsdp"] and shapes["embedding"] == [40, 8]
    assert s["wi_kernel"] == s["mu_wi_kernel"] == ["fsdp"] and shapes["mu_wi_kernel"] == [8, 64]
    assert s["norm_scale"] == ["fsdp"] and s["wi_bias"] == []
    # (2,2,2): all three; Megatron column/row split for attention and FFN
    s, shapes = m["2x2x2"]["specs"], m["2x2x2"]["shard_shapes"]
    assert s["embedding"] == s["mu_embedding"] == ["tensor", "fsdp"]
    assert shapes["embedding"] == [20, 16]
    assert s["query_kernel"] == s["wi_kernel"] == ["fsdp", "tensor"]
    assert s["out_kernel"] == s["wo_kernel"] == ["tensor", "fsdp"]
    assert shapes["wi_kernel"] == [16, 32] and shapes["wo_kernel"] == [32, 16]
    assert s["step"] == s["rng"] == []
    # (1,1,8): tensor parallel only: 5 vocabulary entries, 1 head (4 columns), 8 FFN units each
    shapes = m["1x1x8"]["shard_shapes"]
    assert shapes["embedding"] == [5, 32] and shapes["query_kernel"] == [32, 4]
    assert shapes["wi_kernel"] == [32, 8] and shapes["wo_kernel"] == [8, 32]


def test_sharded_init_and_eval_equal_one_device(runs):
    _, r = runs
    got = r["meshes"]["2x2x2"]
    assert got["init_diff"] < 1e-6 and got["init_spec_embedding"] == ["tensor", "fsdp"]
    ref = r["reference"]["eval"]
    assert ref["tokens"] == got["eval"]["tokens"] > 100
    for k in ("loss", "nll", "correct"):
        np.testing.assert_allclose(got["eval"][k], ref[k], rtol=1e-6)


def test_beam_search_under_a_mesh_equals_one_device(runs):
    _, r = runs
    ref, got = r["reference"]["translations"], r["meshes"]["2x2x2"]["translations"]
    assert len(ref) == len(got) == 12
    assert sum(len(h["tokens"]) for hyps in ref for h in hyps) > 50  # not all empty
    for hyps_ref, hyps_got in zip(ref, got):
        assert [h["tokens"] for h in hyps_got] == [h["tokens"] for h in hyps_ref]
        np.testing.assert_allclose(
            [h["score"] for h in hyps_got], [h["score"] for h in hyps_ref], atol=ATOL, rtol=0
        )


def test_checkpoint_from_2x2x2_continues_on_one_device(runs):
    out, r = runs
    _worker("continue", out, None)
    c = json.loads((out / "continue.json").read_text())
    assert c["restored_step"] == 2 and c["step"] == 3 and len(c["devices"]) == 1
    np.testing.assert_allclose(c["loss"], r["reference"]["loss"][2], atol=ATOL, rtol=0)
    continued = _npz(out / "continued.npz")
    _assert_same_params(continued, _npz(out / "reference.npz"))
    _assert_same_params(continued, _npz(out / "mesh_2x2x2.npz"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_workers(mode: str, out: Path, devices: int, timeout: int) -> None:
    """Worker ``mode`` as processes 0 and 1 of a ``jax.distributed`` run on localhost, each
    with ``devices`` CPU devices; both must exit 0 (their stderr quoted otherwise)."""
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), mode, "--out", str(out)]
            + ["--process-id", str(i), "--num-processes", "2", "--port", port],
            env=_env(devices),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        logs = [p.communicate(timeout=timeout)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, p in enumerate(procs):
        assert p.returncode == 0, f"process {i} failed:\n{logs[i][-4000:]}"


@pytest.mark.slow  # 40 s of waiting
def test_other_processes_wait_for_a_long_preparation_on_process_0(tmp_path):
    """``main_process_first`` waits at the coordination service's barrier: process 1 waits
    the 40 s process 0 prepares (a device collective gave up after 30 s at 4.5M pairs)."""
    _two_workers("main_first", tmp_path, 1, timeout=300)
    for i in range(2):
        assert (tmp_path / f"main_first_{i}.txt").read_text() == "done"


def test_each_process_lays_out_only_its_rows_and_together_they_are_the_global_batch(tmp_path):
    """2 processes × 2 CPU devices, data parallel over all 4: ``train_batch`` with the
    partitioner's ``process_share`` lays out half the rows of every micro-batch."""
    from conftest import random_pairs

    from seq2seq.data.batching import PackedBatches
    from seq2seq.training.batches import train_batch

    _two_workers("host_batches", tmp_path, 2, timeout=600)
    records = [json.loads((tmp_path / f"host_batches_{i}.json").read_text()) for i in range(2)]
    assert [r["share"] for r in records] == [[0, 2], [1, 2]]
    # every batch each process laid out had 4 of the 8 rows (2 micro-batches × 3 steps)
    assert all(r["laid_out_rows"] == [4] * 6 for r in records)
    src, tgt = random_pairs(300, np.random.default_rng(5))  # as the worker
    batches = PackedBatches(src, tgt, max_len=24, rows=8, seed=3)
    for k, step in enumerate(records[0]["steps"]):
        full = train_batch(batches, step["first"], 2)  # one process: the whole global batch
        for i, r in enumerate(records):
            assert r["steps"][k]["host_shape"] == [2, 4, 24]
            assert (r["steps"][k]["real_tokens"], r["steps"][k]["target_tokens"]) == (
                full.real_tokens,
                full.target_tokens,
            )
            gathered = _npz(tmp_path / f"host_{i}_{step['first']}.npz")
            assert gathered.keys() == full.keys()
            for key in full:  # the union of the processes' rows is the global batch
                np.testing.assert_array_equal(gathered[key], full[key])
        assert full.target_tokens == int((full["tgt_segments"] > 0).sum())
        assert full.real_tokens == full.target_tokens + int((full["src_segments"] > 0).sum())


def test_two_processes_equal_one_device(runs):
    """jax.distributed on localhost: 2 processes × 2 CPU devices, mesh (1,2,2)."""
    out, r = runs
    _two_workers("multiprocess", out, 2, timeout=900)
    records = [json.loads((out / f"multiprocess_{i}.json").read_text()) for i in range(2)]
    # each process fed its own half of the 16 rows and holds a quarter of the embedding
    assert records[0]["rows"] == list(range(8)) and records[1]["rows"] == list(range(8, 16))
    assert records[0]["local_shard_shape"] == [20, 16]
    for rec in records:
        np.testing.assert_allclose(rec["losses"], r["reference"]["loss"], atol=ATOL, rtol=0)
    reference = _npz(out / "reference.npz")
    _assert_same_params(_npz(out / "multiprocess.npz"), reference)

    # the checkpoint both processes wrote restores here, on one device
    from sharding_worker import CONFIG

    from seq2seq.training.step import abstract_train_state

    _, abstract = abstract_train_state(CONFIG)
    p = Partitioner(make_mesh(MeshConfig(1, 1, 1), devices=jax.devices()[:1]))
    ck = Checkpointer(out / "mp_checkpoint", async_save=False)
    state, meta = ck.restore(p.abstract(abstract))
    ck.close()
    assert meta == {"step": 3, "processes": 2} and int(state.step) == 3
    restored = {
        jax.tree_util.keystr(k): np.asarray(v)
        for k, v in jax.tree_util.tree_flatten_with_path(state.params)[0]
    }
    _assert_same_params(restored, reference)


def _two_process_run(tmp_path: Path, workdir: Path, *extra: str) -> list[str]:
    """Overrides of a tiny ``seq2seq-train`` run on 2 processes × 2 devices, mesh (1,2,2)
    (add ``distributed.process_id``); ``extra`` sets the steps and intervals."""
    return [
        f"workdir={workdir}",
        f"data.train.path={write_split(tmp_path, 'train', 0, 300)}",
        f"data.dev.path={write_split(tmp_path, 'dev', 300, 20)}",
        f"data.test.path={write_split(tmp_path, 'test', 320, 6)}",
        "data.max_len=32",
        "data.max_tokens=512",
        "tokenizer.vocab_size=200",
        "model.d_model=32",
        "model.num_heads=2",
        "model.d_ff=64",
        "model.num_encoder_layers=1",
        "model.num_decoder_layers=1",
        "train.warmup_steps=2",
        "mesh.data=1",
        "mesh.fsdp=2",
        "mesh.tensor=2",
        f"distributed.coordinator_address=127.0.0.1:{_free_port()}",
        "distributed.num_processes=2",
        *extra,
    ]


def test_training_command_on_two_processes(tmp_path):
    """``seq2seq-train`` on 2 processes × 2 devices: one tokenizer, one log, one metrics file,
    a checkpoint written by both, the test set decoded on the mesh."""
    workdir = tmp_path / "run"
    overrides = _two_process_run(
        tmp_path,
        workdir,
        "train.steps=4",
        "train.eval_every=4",
        "train.checkpoint_every=4",
        "train.log_every=2",
        "decode.beam_size=2",
    )
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), "loop", "--", *overrides, f"distributed.process_id={i}"],
            env=_env(2),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=900) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, p in enumerate(procs):
        assert p.returncode == 0, f"process {i} failed:\n{outputs[i][1][-4000:]}"
        assert "test BLEU" in outputs[i][0]
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["split"], r["step"]) for r in records] == [
        ("train", 2),
        ("train", 4),
        ("dev", 4),
        ("test", 4),
    ]  # written once, by process 0
    assert all(np.isfinite(r["loss"]) for r in records if r["split"] != "test")
    summary = json.loads((workdir / "test.json").read_text())
    assert summary["step"] == 4 and summary["test_sentences"] == 6
    assert len((workdir / "test.hyp").read_text().splitlines()) == 6
    assert (workdir / "checkpoints" / "4").is_dir()
    assert (workdir / "train.log").read_text().count(
        "Partitioner(data=1, fsdp=2, tensor=2; 2 process(es))"
    ) == 1


def test_sigterm_to_one_of_two_processes_stops_both_at_the_same_step(tmp_path):
    """SIGTERM reaches process 1 only: both processes agree to stop after the same step, save
    one checkpoint together and exit 143 (before ``agree_to_stop`` process 0 walked into the
    next step's collectives while process 1 waited in the save, and the job hung)."""
    import signal
    import time

    from seq2seq.config import load_config
    from seq2seq.training.step import abstract_train_state

    workdir = tmp_path / "run"
    overrides = _two_process_run(
        tmp_path,
        workdir,
        "train.steps=100000",
        "train.eval_every=100000",
        "train.checkpoint_every=100000",
        "train.log_every=1",
    )
    logs = [tmp_path / f"process_{i}.log" for i in range(2)]
    procs = []
    try:
        for i in range(2):  # output to files: a full pipe must not stall a process
            with open(logs[i], "w") as f:
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            str(WORKER),
                            "loop",
                            "--",
                            *overrides,
                            f"distributed.process_id={i}",
                        ],
                        env=_env(2),
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                )
        metrics, deadline = workdir / "metrics.jsonl", time.monotonic() + 600
        while not (metrics.is_file() and '"train"' in metrics.read_text()):
            assert all(p.poll() is None for p in procs), logs[0].read_text()[-4000:]
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.2)
        procs[1].send_signal(signal.SIGTERM)
        for i, p in enumerate(procs):
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0) + 120)
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"process {i} did not stop (hung):\n{logs[i].read_text()[-4000:]}"
                ) from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    out = [log.read_text() for log in logs]
    for i, p in enumerate(procs):
        assert p.returncode == 128 + signal.SIGTERM, f"process {i}:\n{out[i][-4000:]}"
        assert "checkpoint saved, rerun the same command to resume" in out[i]
    own = "seq2seq.training.loop: received SIGTERM"
    assert own in out[1] and own not in out[0]
    assert "another process received SIGTERM: stopping at step" in out[0]
    steps = [d.name for d in (workdir / "checkpoints").iterdir() if d.name.isdigit()]
    assert len(steps) == 1, steps  # both processes saved the same step
    step = int(steps[0])
    assert 0 < step < 100000
    for text in out:
        assert f"interrupted at step {step};" in text

    config = load_config(workdir / "config.yaml")
    _, abstract = abstract_train_state(config)
    p = Partitioner(make_mesh(MeshConfig(1, 1, 1), devices=jax.devices()[:1]))
    ck = Checkpointer(workdir / "checkpoints", async_save=False)
    try:
        state, meta = ck.restore(p.abstract(abstract))
    finally:
        ck.close()
    assert int(state.step) == meta["step"] == step
