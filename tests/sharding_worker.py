"""Subprocess side of tests/test_sharding_multidevice.py (run with fake CPU devices).

Each mode runs in its own process so that ``--xla_force_host_platform_device_count`` (or a
``jax.distributed`` runtime) never leaks into the main pytest process. Results go to
``<out>/<mode>.json`` (and ``.npz`` for arrays); the tests assert on them.

Modes:
  meshes        8 devices: single-device reference vs meshes (8,1,1), (2,4,1), (2,2,2), (1,1,8);
                sharding specs; sharded init; eval step; beam search; a checkpoint on (2,2,2).
  continue      1 device: restore the (2,2,2) checkpoint and take the next step.
  multiprocess  2 devices per process, ``jax.distributed`` on 127.0.0.1: the same steps.
  host_batches  2 devices per process, 2 processes: each lays out only its rows of the
                training batches, assembled into global arrays.
  main_first    2 processes: process 0 spends 40 s in ``main_process_first`` (a long data
                preparation); the other waits for it and then sees its file.
  loop          2 devices per process, 2 processes: the real ``seq2seq-train`` command on a
                (1,2,2) mesh (overrides after ``--``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import numpy as np

# run as a script: its directory (tests/) is first on the path
from conftest import BOS, packed_batch, random_pairs, tiny_config

from seq2seq.config import (
    Config,
    DecodeConfig,
    DistributedConfig,
    MeshConfig,
    TrainConfig,
)
from seq2seq.model import build_model
from seq2seq.sharding import Partitioner, initialize_distributed, make_mesh
from seq2seq.training.checkpoints import Checkpointer
from seq2seq.training.step import (
    abstract_train_state,
    create_train_state,
    make_eval_step,
    make_optimizer,
    make_train_step,
    sharded_train_step,
)
from seq2seq.translation import Translator

MESHES = ((8, 1, 1), (2, 4, 1), (2, 2, 2), (1, 1, 8))
STEPS = 3
CHECKPOINT_STEP = 2
# Tiny, but every sharded dimension divides every mesh axis (8 heads, d_ff 64, vocab 40 over
# tensor=8; d_model 32 over fsdp=4). Dropout is on: its masks must not depend on the mesh.
MODEL = tiny_config(num_heads=8, num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.1)
# Adam's eps is raised from 1e-9 to 1e-4 for the comparison only: the attention key bias has
# an exactly zero true gradient (softmax is shift-invariant), so its computed gradient is
# rounding noise (~1e-9) and with eps=1e-9 Adam turns that noise into ±lr updates whose sign
# depends on the summation order. With eps=1e-4 an update is a smooth function of the gradient.
TRAIN = TrainConfig(learning_rate=3e-3, warmup_steps=2, eps=1e-4)
CONFIG = Config(model=MODEL, train=TRAIN)
SENTENCES = [
    "hello world",
    "a",
    "the quick fox",
    "sharding is fun",
    "over the dog",
    "tensor",
    "x y z",
    "data",
    "fully sharded",
    "beams",
    "one more line",
    "end",
]  # one bucket


def _batch() -> dict[str, np.ndarray]:
    src, tgt = random_pairs(28, np.random.default_rng(0), vocab=MODEL.vocab_size)
    batch, _ = packed_batch(src, tgt, 16, 16)
    return {k: np.asarray(v) for k, v in batch.items()}


def _initial_state():
    tx = make_optimizer(TRAIN)
    graphdef, state = create_train_state(build_model(MODEL, 0), tx, 0)
    kw = dict(graphdef=graphdef, tx=tx, bos_id=BOS, label_smoothing=0.1)
    return graphdef, state, kw


def _host(tree):
    return jax.tree.map(np.asarray, tree)


def _flat(tree) -> dict[str, np.ndarray]:
    return {
        jax.tree_util.keystr(k): np.asarray(v)
        for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def _max_diff(a, b) -> float:
    return max(
        float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


def _run(step_fn, state, put, steps=STEPS, on_step=None):
    """``steps`` train steps; per step: loss per token, grad norm, Adam moments."""
    batch = _batch()
    record = {"loss": [], "grad_norm": [], "mu": [], "nu": [], "params": []}
    for k in range(steps):
        state, m = step_fn(state, put(batch))
        m = jax.device_get(m)
        record["loss"].append(float(m["loss"] / m["tokens"]))
        record["grad_norm"].append(float(m["grad_norm"]))
        adam = state.opt_state[1][0]  # chain(clip, adamw) → adamw → ScaleByAdamState
        record["mu"].append(_host(adam.mu))
        record["nu"].append(_host(adam.nu))
        record["params"].append(_host(state.params))
        if on_step is not None:
            on_step(k + 1, state)
    return state, record


def _gradients(record) -> list:
    """Gradients of each step recovered from Adam's first moment: mu_k = b1·mu_{k-1} + (1-b1)·g_k
    (after global-norm clipping, which is identical when the norms agree)."""
    b1 = TRAIN.b1
    grads, prev = [], jax.tree.map(np.zeros_like, record["mu"][0])
    for mu in record["mu"]:
        grads.append(jax.tree.map(lambda m, p: (m - b1 * p) / (1 - b1), mu, prev))
        prev = mu
    return grads


def _compare(ref, got) -> dict:
    g_ref, g_got = _gradients(ref), _gradients(got)
    return {
        "loss": got["loss"],
        "grad_norm": got["grad_norm"],
        "grad_diff": max(_max_diff(a, b) for a, b in zip(g_ref, g_got)),
        "grad_scale": max(float(np.max(np.abs(x))) for x in jax.tree.leaves(g_ref[-1])),
        "param_diff": max(_max_diff(a, b) for a, b in zip(ref["params"], got["params"])),
        "param_change": _max_diff(ref["params"][-1], ref["params"][0]),
        "moment_diff": max(_max_diff(a, b) for a, b in zip(ref["nu"], got["nu"])),
    }


class CharTokenizer:
    """Stands in for SentencePiece: one id per character (4..39), EOS = 3."""

    pad_id, unk_id, bos_id, eos_id = 0, 1, BOS, 3

    def encode(self, lines):
        return [
            np.array([4 + ord(c) % 36 for c in line] + [self.eos_id], np.int32) for line in lines
        ]

    def decode(self, ids):
        return [" ".join(map(str, x)) for x in ids]


def _translate(graphdef, params, partitioner=None):
    decode = DecodeConfig(beam_size=3, max_tokens=96, max_len_a=1.0, max_len_b=4)
    translator = Translator(
        graphdef, params, CharTokenizer(), decode, max_src_len=32, partitioner=partitioner
    )
    return [
        [{"tokens": list(h.tokens), "score": h.score} for h in hyps]
        for hyps in translator.translate(SENTENCES, nbest=3)
    ]


def _spec(x) -> list:
    return [list(a) if isinstance(a, tuple) else a for a in x.sharding.spec]


def meshes(out: Path) -> None:
    assert jax.device_count() == 8, jax.devices()
    graphdef, state0, kw = _initial_state()
    host0 = _host(state0)
    batch = _batch()
    result = {"meshes": {}}

    ref_state, ref = _run(
        jax.jit(make_train_step(**kw), donate_argnums=0),
        jax.device_put(host0, jax.devices()[0]),
        lambda b: jax.device_put(b, jax.devices()[0]),
    )
    result["reference"] = {"loss": ref["loss"], "grad_norm": ref["grad_norm"]}
    np.savez(out / "reference.npz", **_flat(ref_state.params))
    ref_eval = jax.device_get(
        jax.jit(make_eval_step(graphdef, bos_id=BOS, label_smoothing=0.1))(ref_state.params, batch)
    )
    result["reference"]["eval"] = {k: float(v) for k, v in ref_eval.items()}
    result["reference"]["translations"] = _translate(graphdef, _host(ref_state.params))

    _, abstract = abstract_train_state(CONFIG)
    for shape in MESHES:
        p = Partitioner(make_mesh(MeshConfig(*shape)))
        shardings = p.shardings(abstract)
        fn = sharded_train_step(p, shardings, **kw)

        def on_step(k, state):
            if shape == (2, 2, 2) and k == CHECKPOINT_STEP:
                ck = Checkpointer(out / "checkpoint", async_save=False)
                ck.save(k, state, {"step": k})
                ck.close()

        state, got = _run(fn, p.place(host0), p.shard_batch, on_step=on_step)
        r = _compare(ref, got)
        params, mu = state.params, state.opt_state[1][0].mu
        layer = params["decoder_layers"][0]
        arrays = {
            "embedding": params["embed"]["embedding"],
            "query_kernel": layer["self_attention"]["query"]["kernel"],
            "out_kernel": layer["self_attention"]["out"]["kernel"],
            "wi_kernel": layer["ffn"]["wi"]["kernel"],
            "wo_kernel": layer["ffn"]["wo"]["kernel"],
            "wi_bias": layer["ffn"]["wi"]["bias"],
            "norm_scale": params["decoder_norm"]["scale"],
            "mu_embedding": mu["embed"]["embedding"],
            "mu_wi_kernel": mu["decoder_layers"][0]["ffn"]["wi"]["kernel"],
            "step": state.step,
            "rng": state.rng,
        }
        r["specs"] = {k: _spec(v) for k, v in arrays.items()}
        r["shard_shapes"] = {k: list(v.addressable_shards[0].data.shape) for k, v in arrays.items()}
        r["global_shapes"] = {k: list(v.shape) for k, v in arrays.items()}
        r["batch_shard_shape"] = list(p.shard_batch(batch)["src"].addressable_shards[0].data.shape)
        if shape == (2, 2, 2):
            # the loop's path: sharded init (each device builds its shards) and sharded eval
            init = p.init_state(
                lambda: create_train_state(build_model(MODEL, 0), make_optimizer(TRAIN), 0)[1],
                abstract,
            )
            r["init_diff"] = _max_diff(init, host0)
            r["init_spec_embedding"] = _spec(init.params["embed"]["embedding"])
            eval_step = make_eval_step(
                graphdef,
                bos_id=BOS,
                label_smoothing=0.1,
                param_layout=p.compute_layout(shardings.params),
            )
            ev = p.jit(eval_step, shardings.params)(state.params, p.shard_batch(batch))
            r["eval"] = {k: float(v) for k, v in jax.device_get(ev).items()}
            r["translations"] = _translate(graphdef, _host(ref_state.params), p)
            np.savez(out / "mesh_2x2x2.npz", **_flat(state.params))
        result["meshes"]["x".join(map(str, shape))] = r
    (out / "meshes.json").write_text(json.dumps(result))


def continue_on_one_device(out: Path) -> None:
    """Restore the (2,2,2) checkpoint of step 2 on one device and take step 3."""
    assert jax.device_count() == 1
    graphdef, _, kw = _initial_state()
    _, abstract = abstract_train_state(CONFIG)
    p = Partitioner(make_mesh(MeshConfig(1, 1, 1)))
    ck = Checkpointer(out / "checkpoint", async_save=False)
    state, meta = ck.restore(p.abstract(abstract))
    ck.close()
    restored_step = int(state.step)
    fn = sharded_train_step(p, p.shardings(abstract), **kw)
    batch = p.shard_batch(_batch())
    for _ in range(STEPS - restored_step):
        state, m = fn(state, batch)
    m = jax.device_get(m)
    np.savez(out / "continued.npz", **_flat(state.params))
    (out / "continue.json").write_text(
        json.dumps(
            {
                "restored_step": restored_step,
                "meta": meta,
                "step": int(state.step),
                "loss": float(m["loss"] / m["tokens"]),
                "devices": [str(d) for d in state.params["embed"]["embedding"].devices()],
            }
        )
    )


def _start_distributed(process_id: int, num_processes: int, port: int) -> None:
    """``jax.distributed`` on localhost: this process is ``process_id`` of ``num_processes``."""
    initialize_distributed(
        DistributedConfig(
            coordinator_address=f"127.0.0.1:{port}",
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=120,
        )
    )


def multiprocess(out: Path, process_id: int, num_processes: int, port: int) -> None:
    """One of ``num_processes`` processes on localhost, each with 2 CPU devices; mesh (1,2,2)
    puts fsdp across the processes and tensor within each."""
    _start_distributed(process_id, num_processes, port)
    from jax.experimental import multihost_utils

    assert jax.process_count() == num_processes and jax.local_device_count() == 2
    graphdef, state0, kw = _initial_state()
    _, abstract = abstract_train_state(CONFIG)
    p = Partitioner(make_mesh(MeshConfig(1, num_processes, 2)))
    fn = sharded_train_step(p, p.shardings(abstract), **kw)
    batch = _batch()
    state = p.place(_host(state0))
    losses = []
    for _ in range(STEPS):
        state, m = fn(state, p.shard_batch(batch))
        m = jax.device_get(m)
        losses.append(float(m["loss"] / m["tokens"]))
    ck = Checkpointer(out / "mp_checkpoint", async_save=False)  # every process writes its shards
    ck.save(STEPS, state, {"step": STEPS, "processes": num_processes})
    ck.close()
    params = multihost_utils.process_allgather(state.params, tiled=True)
    rows = p.process_rows(len(batch["src"])).tolist()
    record = {
        "process": jax.process_index(),
        "losses": losses,
        "rows": rows,
        "local_shard_shape": list(
            state.params["embed"]["embedding"].addressable_shards[0].data.shape
        ),
    }
    (out / f"multiprocess_{process_id}.json").write_text(json.dumps(record))
    if process_id == 0:
        np.savez(out / "multiprocess.npz", **_flat(params))
    multihost_utils.sync_global_devices("done")


def host_batches(out: Path, process_id: int, num_processes: int, port: int) -> None:
    """One of ``num_processes`` processes, 2 CPU devices each, mesh (data=2·n, 1, 1): the
    training loop's host batches (``train_batch`` with ``process_share``) assembled into
    global arrays. Records the rows each process laid out and the gathered global batches."""
    _start_distributed(process_id, num_processes, port)
    from jax.experimental import multihost_utils

    from seq2seq.data import batching
    from seq2seq.data.batching import PackedBatches
    from seq2seq.training.batches import train_batch

    laid_out = []  # the rows each make_batch call laid out
    real_make_batch = batching.make_batch

    def spy(rows, src, tgt, num_rows, max_len):
        laid_out.append(num_rows)
        return real_make_batch(rows, src, tgt, num_rows, max_len)

    batching.make_batch = spy
    src, tgt = random_pairs(300, np.random.default_rng(5))
    batches = PackedBatches(src, tgt, max_len=24, rows=8, seed=3)
    p = Partitioner(make_mesh(MeshConfig(2 * num_processes, 1, 1)))
    share = p.process_share(batches.rows)
    record: dict = {"share": list(share), "steps": []}
    for first in (0, 3, batches.batches_in_epoch(0) - 1):
        host = train_batch(batches, first, 2, share)
        placed = p.shard_batch(host, 1, batches.rows)
        gathered = {
            k: np.asarray(multihost_utils.process_allgather(v, tiled=True))
            for k, v in placed.items()
        }
        record["steps"].append(
            {
                "first": first,
                "host_shape": list(host["src"].shape),
                "real_tokens": host.real_tokens,
                "target_tokens": host.target_tokens,
            }
        )
        np.savez(out / f"host_{process_id}_{first}.npz", **gathered)
    record["laid_out_rows"] = laid_out
    (out / f"host_batches_{process_id}.json").write_text(json.dumps(record))
    multihost_utils.sync_global_devices("done")


def main_first(out: Path, process_id: int, num_processes: int, port: int) -> None:
    """Process 0 takes 40 s in ``main_process_first`` (longer than the ~30 s a device
    collective waits on the CPU), then writes a file the others read after their turn."""
    import time

    from seq2seq.sharding import main_process_first

    _start_distributed(process_id, num_processes, port)
    marker = out / "prepared.txt"
    with main_process_first("prepare"):
        if process_id == 0:
            time.sleep(40)
            marker.write_text("done")
        seen = marker.read_text()
    (out / f"main_first_{process_id}.txt").write_text(seen)


def loop(overrides: list[str]) -> None:
    """The training command as a user runs it, on every process."""
    from seq2seq import cli

    sys.exit(cli.train_main(overrides))


if __name__ == "__main__":
    if sys.argv[1:2] == ["loop"]:
        loop(sys.argv[sys.argv.index("--") + 1 :])
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "mode", choices=["meshes", "continue", "multiprocess", "host_batches", "main_first"]
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--num-processes", type=int, default=2)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    if args.mode == "meshes":
        meshes(args.out)
    elif args.mode == "continue":
        continue_on_one_device(args.out)
    elif args.mode == "host_batches":
        host_batches(args.out, args.process_id, args.num_processes, args.port)
    elif args.mode == "main_first":
        main_first(args.out, args.process_id, args.num_processes, args.port)
    else:
        multiprocess(args.out, args.process_id, args.num_processes, args.port)
