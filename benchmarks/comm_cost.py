"""Bytes communicated per train step for a few meshes, read from the compiled program.

Compiles the real sharded train step (``seq2seq.training.step.sharded_train_step``) for
each mesh on fake CPU devices (``--xla_force_host_platform_device_count``; nothing runs, the
inputs are abstract) and sums, over the collectives in the partitioned HLO, the bytes of their
operands on one device: ``all-reduce``, ``all-gather``, ``reduce-scatter``, ``all-to-all`` and
``collective-permute``. This is the sharding cost you will pay on GPUs/TPUs, visible before one
is at hand (XLA on GPU/TPU may fuse or schedule differently, but what must move is the same).
Also reported: the train state (parameters + Adam moments) stored per device.

Usage::

    python -m benchmarks.comm_cost                      # both presets, the default meshes
    python -m benchmarks.comm_cost --preset tatoeba --mesh 2,2,2 --mesh 8,1,1
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

DEVICES = 8
if "jax" not in sys.modules:  # must be set before jax starts
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={DEVICES}"
    ).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from seq2seq.config import Config, MeshConfig, replace  # noqa: E402
from seq2seq.resolve import resolve  # noqa: E402
from seq2seq.sharding import MeshError, Partitioner, check_model, make_mesh  # noqa: E402
from seq2seq.training.context import train_context  # noqa: E402

MESHES = ((8, 1, 1), (1, 8, 1), (2, 4, 1), (2, 2, 2), (2, 1, 4), (1, 1, 8))
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_OP = re.compile(
    r"=\s*(?P<shape>\(.*?\)|\S+)\s+(?P<op>" + "|".join(COLLECTIVES) + r")(?:-start)?\("
)
_ARRAY = re.compile(r"(?P<dtype>[a-z]+[0-9]*)\[(?P<dims>[0-9,]*)\]")
_BITS = {
    "pred": 8,
    "s8": 8,
    "u8": 8,
    "s16": 16,
    "u16": 16,
    "f16": 16,
    "bf16": 16,
    "s32": 32,
    "u32": 32,
    "f32": 32,
    "s64": 64,
    "u64": 64,
    "f64": 64,
}


def preset(name: str) -> Config:
    """``tatoeba``: configs/tatoeba_en_es.yaml (vocab 8000). ``base``: Transformer base
    (Vaswani et al. 2017, Table 3: d_model 512, 8 heads, 6+6 layers, d_ff 2048), 32k vocabulary,
    64 rows × 128 tokens per batch."""
    if name == "tatoeba":
        return resolve("configs/tatoeba_en_es.yaml", validate=False).config  # its batch size
    if name == "base":
        return replace(
            Config(),
            **{
                "model.vocab_size": 32000,
                "model.d_model": 512,
                "model.num_heads": 8,
                "model.num_encoder_layers": 6,
                "model.num_decoder_layers": 6,
                "model.d_ff": 2048,
                "data.max_len": 128,
                "data.max_tokens": 8192,
            },
        )
    raise ValueError(f"unknown preset {name!r}")


def _bytes(shape_text: str) -> int:
    total = 0
    for m in _ARRAY.finditer(shape_text):
        dims = [int(d) for d in m["dims"].split(",") if d]
        total += int(np.prod(dims, dtype=np.int64)) * _BITS.get(m["dtype"], 32) // 8
    return total


def _group_size(line: str) -> int:
    """Devices per replica group, from the three HLO spellings of ``replica_groups``."""
    if m := re.search(r"replica_groups=\{\{([0-9,]*)\}", line):
        return len(m[1].split(","))
    if m := re.search(r"replica_groups=\[(\d+),(\d+)\]<=", line):
        return int(m[2])
    if m := re.search(r"replica_groups=mesh\[([^\]]*)\].*?\{([^}]*)\}", line):
        sizes = dict(re.findall(r"'(\w+)'=(\d+)", m[1]))
        return int(np.prod([int(sizes[a]) for a in re.findall(r"'(\w+)'", m[2])]))
    return 1


def collective_bytes(hlo_text: str) -> dict[str, list[float]]:
    """``{op: [count, operand bytes, bytes sent]}`` per device over the collectives of
    partitioned HLO.

    Operand bytes S come from the result shape: equal for all-reduce, all-to-all and
    collective-permute; result / n for all-gather; result × n for reduce-scatter (n devices
    per group). Bytes sent per device use the bandwidth-optimal (ring) algorithms:
    all-reduce 2(n-1)/n·S, all-gather (n-1)·S, reduce-scatter and all-to-all (n-1)/n·S,
    collective-permute S.
    """
    out = {op: [0, 0, 0.0] for op in COLLECTIVES}
    for line in hlo_text.splitlines():
        m = _OP.search(line)
        if not m:
            continue
        op, size, n = m["op"], _bytes(m["shape"]), _group_size(line)
        if op == "all-gather":
            size //= n
        elif op == "reduce-scatter":
            size *= n
        sent = {
            "all-reduce": 2 * (n - 1) / n * size,
            "all-gather": (n - 1) * size,
            "collective-permute": size,
        }.get(op, (n - 1) / n * size)
        out[op][0] += 1
        out[op][1] += size
        out[op][2] += sent
    return out


def measure(config: Config, shape: tuple[int, int, int]) -> dict:
    """Compile the train step of ``config`` on mesh ``shape`` as the training loop builds it
    (``seq2seq.training.context.train_context``); collective bytes and state size."""
    p = Partitioner(make_mesh(MeshConfig(*shape)))
    check_model(config.model, p.mesh)
    context = train_context(config, p)
    abstract, shardings = context.abstract, context.shardings
    start = time.perf_counter()
    compiled = context.lower().compile()
    seconds = time.perf_counter() - start
    state_bytes = sum(
        int(np.prod(s.shard_shape(x.shape))) * x.dtype.itemsize
        for x, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings))
    )
    params = sum(x.size for x in jax.tree.leaves(abstract.params))
    return {
        "collectives": collective_bytes(compiled.as_text() or ""),  # None: no text, no bytes
        "state_bytes": state_bytes,
        "params": params,
        "compile_seconds": seconds,
    }


def mesh_shape(text: str) -> tuple[int, int, int]:
    """``data,fsdp,tensor`` → its three sizes (ValueError unless three integers)."""
    data, fsdp, tensor = (int(x) for x in text.split(","))
    return data, fsdp, tensor


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", action="append", choices=["tatoeba", "base"])
    parser.add_argument(
        "--mesh", action="append", type=mesh_shape, help="data,fsdp,tensor (repeatable)"
    )
    args = parser.parse_args(argv)
    presets = args.preset or ["tatoeba", "base"]
    meshes = args.mesh or MESHES
    assert jax.device_count() == DEVICES, jax.devices()
    mb = 1 / 2**20
    print(
        "| model | mesh (data, fsdp, tensor) | all-reduce | all-gather | reduce-scatter | "
        "all-to-all | collective-permute | operands MiB | sent MiB (ring) | state MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in presets:
        config = preset(name)
        for shape in meshes:
            try:
                r = measure(config, shape)
            except MeshError as e:
                print(f"| {name} | {shape} | {e} | | | | | | | |", flush=True)
                continue
            c = r["collectives"]
            cells = [f"{c[op][1] * mb:.1f} ({c[op][0]})" if c[op][0] else "—" for op in COLLECTIVES]
            total = sum(v[1] for v in c.values()) * mb
            sent = sum(v[2] for v in c.values()) * mb
            label = f"{name} ({r['params'] / 1e6:.1f}M)"
            print(
                f"| {label} | {shape} | "
                + " | ".join(cells)
                + f" | {total:.1f} | {sent:.1f} | {r['state_bytes'] * mb:.1f} |",
                flush=True,
            )
            print(f"  compiled in {r['compile_seconds']:.0f} s", file=sys.stderr, flush=True)
    print(
        "\nPer device and train step: operand MiB of each kind of collective (number of ops); "
        "their total; MiB sent with ring algorithms; parameters + Adam moments stored."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
