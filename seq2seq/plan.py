"""Plan a run for accelerators this machine does not have (``seq2seq-plan``).

The train step ``seq2seq-train`` compiles (``seq2seq.training.context.train_context``: the same
model, shardings, donation, micro-batches, precision and attention kernel) and one chunk of the
test decode (``seq2seq.translation.search_step`` with the strategy ``decode.search`` names) are
compiled ahead of time for a target's compile-only devices ("deviceless" compilation,
``jax.experimental.topologies``; MaxText's ``train_compile.py`` does the same), and XLA's
figures for them are read back: per-device memory (``memory_analysis``), FLOPs and bytes
accessed (``cost_analysis``) and the collectives in the compiled HLO. TPU targets need libtpu
(``pip install -e '.[tpu]'``); GPU targets need ``jax[cuda12]`` and a ``GpuTargetConfigProto``
(``seq2seq/specs/``). Nothing runs on a device: every time below is a roofline lower bound.

Caveats, measured with jax 0.10.2 / libtpu 0.0.42.1:

* XLA's cost analysis counts a ``while`` loop's body once, so the step's FLOPs and bytes are
  those of one micro-batch (``jax.lax.scan``) plus the update: ``flops_per_step`` multiplies
  them by ``train.grad_accum_steps`` (the update, a few per cent, counted that many times);
  a decode's figures are its encoder plus one decoding step.
* A program compiled for a GPU target has no cost analysis (jaxlib 0.10.2): its FLOPs and
  bytes are XLA's analysis of the whole program before partitioning and optimisation,
  divided by the devices (``_unpartitioned_cost``).
  The GPU compiler does not refuse a program that exceeds the device's memory (the peak is
  compared here), runs no autotuning, and builds no cuDNN graph without a device.
* Collectives are counted in the HLO text; one inside a loop body counts once per
  micro-batch in the train step (``in_loop``), once in the decode.
* The peak is argument + output − aliased (donated) + temporary bytes; libtpu refuses to
  compile a program that does not fit, and that refusal is read as "does not fit" with the
  size it names.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType

from seq2seq.config import Config, ConfigError, replace
from seq2seq.data.batching import batch_rows
from seq2seq.data.pipeline import decode_source_limit
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from seq2seq.model.flops import train_flops_per_step
from seq2seq.search import strategy
from seq2seq.sharding import MESH_AXES, MeshError, Partitioner, check_model, mesh_shape
from seq2seq.training.context import TrainContext, train_context
from seq2seq.translation import bucket_length, chunk_rows, chunk_rules, search_step

SPECS = Path(__file__).resolve().parent / "specs"


@dataclasses.dataclass(frozen=True)
class Device:
    """One accelerator's figures, as its maker states them (decimal units).

    Attributes:
      name: the maker's name.
      memory: bytes of device memory (HBM).
      usable: the share of ``memory`` a JAX program may use: 1 on TPU; 0.75 on GPU, JAX's
        default preallocation (``XLA_PYTHON_CLIENT_MEM_FRACTION`` raises it).
      flops: dense bfloat16 FLOP/s (no sparsity).
      memory_bandwidth: HBM bytes/s.
      link_bandwidth: bytes/s one device sends to the others (ICI; NVLink, one direction).
      source: where the figures are from.
    """

    name: str
    memory: float
    usable: float
    flops: float
    memory_bandwidth: float
    link_bandwidth: float
    source: str


# The one device table (figures from the makers' pages named in ``source``).
DEVICES: dict[str, Device] = {
    "v5e": Device(
        "TPU v5e",
        16e9,
        1.0,
        197e12,
        819e9,
        1600e9 / 8,
        "cloud.google.com/tpu/docs/v5e (16 GB HBM2, 819 GBps, 197 TFLOPs bf16, ICI 1,600 Gbps)",
    ),
    "v5p": Device(
        "TPU v5p",
        95e9,
        1.0,
        459e12,
        2765e9,
        4800e9 / 8,
        "cloud.google.com/tpu/docs/v5p (95 GB HBM2e, 2,765 GBps, 459 TFLOPs bf16, ICI 4,800 Gbps)",
    ),
    "v6e": Device(
        "TPU v6e",
        32e9,
        1.0,
        918e12,
        1640e9,
        3584e9 / 8,
        "cloud.google.com/tpu/docs/v6e (32 GB HBM, 1,640 GBps, 918 TFLOPs bf16, ICI 3,584 Gbps)",
    ),
    "h100": Device(
        "NVIDIA H100 SXM",
        80e9,
        0.75,
        989e12,
        3.35e12,
        450e9,
        "nvidia.com/en-us/data-center/h100 (80 GB, 3.35 TB/s, 1,979 TFLOPS bf16 with sparsity, "
        "NVLink 900 GB/s both directions)",
    ),
    "h200": Device(
        "NVIDIA H200 SXM",
        141e9,
        0.75,
        989e12,
        4.8e12,
        450e9,
        "nvidia.com/en-us/data-center/h200 (141 GB, 4.8 TB/s, 1,979 TFLOPS bf16 with sparsity, "
        "NVLink 900 GB/s both directions)",
    ),
}


@dataclasses.dataclass(frozen=True)
class Target:
    """A slice or node to compile for.

    Attributes:
      name: as ``--target`` names it (``tpu-v5e-8``: Cloud TPU's name, whose number counts
        TensorCores, so a v5p-8 has 4 chips; ``h100x8``: 8 GPUs).
      device: a ``DEVICES`` key.
      platform: ``tpu`` or ``cuda``.
      topology: the topology name libtpu / XLA takes (``v5e:2x4``, ``1x1x8``).
      host_bounds: chips per host (TPU), as ``chips_per_host_bounds``.
    """

    name: str
    device: str
    platform: str
    topology: str
    host_bounds: tuple[int, int, int] = (1, 1, 1)

    @property
    def figures(self) -> Device:
        return DEVICES[self.device]


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("tpu-v5e-8", "v5e", "tpu", "v5e:2x4", (2, 4, 1)),
        Target("tpu-v5e-32", "v5e", "tpu", "v5e:4x8", (2, 2, 1)),
        Target("tpu-v5p-8", "v5p", "tpu", "v5p:2x2x1", (2, 2, 1)),
        Target("tpu-v5p-32", "v5p", "tpu", "v5p:2x2x4", (2, 2, 1)),
        Target("tpu-v6e-8", "v6e", "tpu", "v6e:2x4", (2, 4, 1)),
        Target("h100x8", "h100", "cuda", "1x1x8"),
        Target("h200x8", "h200", "cuda", "1x1x8"),
    )
}
# H200 is H100's GH100 chip with more and faster HBM: XLA's two target configs differ in
# these fields (and in names), so the H200 one is the H100 one with them replaced
_GPU_MEMORY = {"h200": {"memory_bandwidth": 4_800_000_000_000, "device_memory_size": 151397597184}}


def gpu_target_config(device: str) -> str:
    """The ``GpuTargetConfigProto`` text of a ``DEVICES`` GPU: XLA's H100 SXM config
    (``seq2seq/specs/h100_sxm.txtpb``), with ``_GPU_MEMORY``'s fields for the H200."""
    text = (SPECS / "h100_sxm.txtpb").read_text(encoding="utf-8")
    for field, value in _GPU_MEMORY.get(device, {}).items():
        text, n = re.subn(rf"(?m)^(\s*{field}:)\s*\d+$", rf"\g<1> {value}", text)
        assert n == 1, field
    return text


def target(name: str) -> Target:
    """The ``TARGETS`` entry ``name``.

    Raises:
      ConfigError: an unknown name (the message lists the known ones).
    """
    if name not in TARGETS:
        raise ConfigError(f"--target {name!r} is not one of {', '.join(TARGETS)}")
    return TARGETS[name]


@functools.cache
def compile_only_devices(t: Target) -> tuple[Any, ...]:
    """The compile-only devices of ``t`` (``jax.experimental.topologies``).

    Raises:
      RuntimeError: the platform's compiler is not installed (libtpu for TPU targets,
        ``jax[cuda12]`` for GPU ones), with what to install.
    """
    from jax.experimental import topologies

    # libtpu lets one process at a time load it (/tmp/libtpu_lockfile) unless told otherwise;
    # compiling touches no chip, so several plans (or test workers) may load it at once
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        if t.platform == "tpu":
            topo = topologies.get_topology_desc(
                platform="tpu",
                topology_name=t.topology,
                chip_config_name="default",
                chips_per_host_bounds=t.host_bounds,
                num_slices=1,
                wrap=(False, False, False),
            )
        else:
            topo = topologies.get_topology_desc(
                platform="cuda", topology=t.topology, target_config=gpu_target_config(t.device)
            )
    except (RuntimeError, ValueError, NotImplementedError) as e:
        need = (
            "libtpu: pip install -e '.[tpu]'"
            if t.platform == "tpu"
            else "pip install -e '.[cuda12]'"
        )
        raise RuntimeError(
            f"--target {t.name}: cannot compile for {t.platform} ({need}): {e}"
        ) from e
    return tuple(topo.devices)


def partitioner_for(config: Config, devices: Sequence[Any], shape: Sequence[int] | None = None):
    """A ``Partitioner`` over ``devices`` with the mesh ``shape`` (data, fsdp, tensor), or the
    config's ``mesh`` section resolved for them, checked as ``seq2seq-train`` checks it.

    Raises:
      MeshError: sizes that do not multiply to the devices, heads or FFN units ``tensor`` does
        not divide, or batch rows ``data × fsdp`` does not divide.
    """
    sizes = tuple(shape) if shape is not None else mesh_shape(config.mesh, len(devices))
    mesh = jax.make_mesh(
        sizes, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=list(devices)
    )
    check_model(config.model, mesh)
    rows, shards = batch_rows(config.data), sizes[0] * sizes[1]
    if rows % shards:
        raise MeshError(
            f"{rows} batch rows (data.max_tokens // data.max_len) are not divisible by "
            f"data × fsdp = {shards}; change data.max_tokens or the mesh"
        )
    return Partitioner(mesh)


# -- reading a compiled program -------------------------------------------------------------
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2,
                "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}  # fmt: skip
_ARRAY = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([\d,]*)\]")
_OP = re.compile(r"=\s*(.*?)\s(" + "|".join(COLLECTIVES) + r")(-start)?\(")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_BODY = re.compile(r"\bbody=%?([\w.\-]+)")
_CALLED = re.compile(r"(?:calls|to_apply|body|condition|branch_computations)=\{?%?([\w.\-]+)")


def _array_bytes(text: str, largest: bool = False) -> int:
    """Bytes of the arrays named in an HLO type: all of a tuple's (a combined collective), or
    its largest (an async ``-start``, whose tuple holds operands and results)."""
    sizes = [
        _DTYPE_BYTES[d] * math.prod(int(n) for n in dims.split(",") if n)
        for d, dims in _ARRAY.findall(text)
    ]
    return max(sizes, default=0) if largest else sum(sizes)


def collectives(hlo: str) -> list[dict[str, Any]]:
    """The collectives of a compiled program's HLO text, by kind: ``kind``, ``count``
    (instructions; an async ``-start``/``-done`` pair once), ``bytes`` (the sum of their
    results, per device; an async one's largest array) and ``in_loop`` (how many sit in a ``while``
    body, or in what one calls)."""
    computations: dict[str, list[str]] = {}
    name = ""
    for line in hlo.splitlines():
        m = _COMPUTATION.match(line)
        if m and not line.startswith(" "):
            name = m.group(1)
            computations[name] = []
        elif name:
            computations[name].append(line)
    bodies = {b for lines in computations.values() for ln in lines for b in _BODY.findall(ln)}
    looped, todo = set(), list(bodies)
    while todo:
        c = todo.pop()
        if c in looped or c not in computations:
            continue
        looped.add(c)
        todo.extend(x for ln in computations[c] for x in _CALLED.findall(ln))
    found: dict[str, dict[str, Any]] = {}
    for comp, lines in computations.items():
        for ln in lines:
            m = _OP.search(ln)
            if not m:
                continue
            entry = found.setdefault(m.group(2), {"count": 0, "bytes": 0, "in_loop": 0})
            entry["count"] += 1
            entry["bytes"] += _array_bytes(m.group(1), largest=bool(m.group(3)))
            entry["in_loop"] += comp in looped
    return [{"kind": k, **found[k]} for k in COLLECTIVES if k in found]


def attention_kernel(config: Config, hlo: str) -> str:
    """The attention implementation the compiled program holds: a cuDNN fused-attention or a
    Pallas/Mosaic custom call when its text has one, else XLA's own ops for
    ``model.attention``."""
    if "__cudnn$fmha" in hlo:
        return "cuDNN fused attention (custom call __cudnn$fmha)"
    if "tpu_custom_call" in hlo:
        return "Pallas/Mosaic TPU kernel (tpu_custom_call)"
    kind = config.model.attention
    how = {"dense": "whole score matrix", "chunked": "blockwise loops"}.get(kind, "")
    return f"XLA {kind} ({how}; no fused-attention custom call)" if how else f"XLA {kind}"


# libtpu's refusals: "Used 20.1G of 15.75G hbm" or "the total memory required for HLO
# temporaries (80.23G) exceeds available HBM (15.75G)": the first size is what it needs
_OOM = re.compile(r"(?:Used\s+|required for [^(]*\()([\d.]+)([KMGT])", re.IGNORECASE)
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@dataclasses.dataclass
class Compiled:
    """XLA's figures for one compiled program, per device (bytes, FLOPs).

    ``peak`` = argument + output − alias + temp; ``fits`` compares it with the device's
    usable memory. A program the compiler refused for memory has ``error`` set and the
    figures the message gives (``peak``; the rest 0).
    """

    argument: int = 0
    output: int = 0
    alias: int = 0
    temp: int = 0
    code: int = 0
    peak: int = 0
    xla_flops: float = 0.0
    bytes_accessed: float = 0.0
    collectives: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    attention: str = ""
    compile_seconds: float = 0.0
    error: str = ""
    cost_source: str = "compiled"  # or "unpartitioned": see _unpartitioned_cost


def _unpartitioned_cost(lowered: Any, devices: int) -> dict[str, float]:
    """XLA's cost analysis of the whole program before partitioning (the CPU backend's, a
    JAX-internal call), its FLOPs and bytes ÷ ``devices``; {} where it is not available."""
    try:
        from jax._src import xla_bridge
        from jax._src.lib import _jax

        cost = _jax.hlo_module_cost_analysis(
            xla_bridge.get_backend("cpu"), lowered.compiler_ir("hlo").get_hlo_module()
        )
    except Exception:  # a JAX without that call: no figures rather than no plan
        return {}
    return {k: cost.get(k, 0.0) / devices for k in ("flops", "bytes accessed")}


def compile_lowered(lowered: Any, config: Config, devices: int = 1) -> Compiled:
    """Compile ``lowered`` (for ``devices`` devices) and read its figures (a memory refusal
    becomes ``error``)."""
    import time

    t0 = time.perf_counter()
    try:
        exe = lowered.compile()
    except Exception as e:  # JaxRuntimeError: RESOURCE_EXHAUSTED (see _OOM)
        text = str(e)
        m = _OOM.search(text)
        if "RESOURCE_EXHAUSTED" not in text or not m:
            raise
        used = float(m.group(1)) * _UNITS[m.group(2).upper()]
        first = text.strip().splitlines()[0][:300]
        return Compiled(peak=int(used), error=first, compile_seconds=time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    mem = exe.memory_analysis()
    cost = exe.cost_analysis()
    source = "compiled" if cost else "unpartitioned"
    cost = cost or _unpartitioned_cost(lowered, devices)
    cost = cost[0] if isinstance(cost, list) else (cost or {})
    hlo = exe.as_text()
    c = Compiled(
        argument=int(mem.argument_size_in_bytes),
        output=int(mem.output_size_in_bytes),
        alias=int(mem.alias_size_in_bytes),
        temp=int(mem.temp_size_in_bytes),
        code=int(mem.generated_code_size_in_bytes),
        xla_flops=float(cost.get("flops", 0.0)),
        bytes_accessed=float(cost.get("bytes accessed", 0.0)),
        collectives=collectives(hlo),
        attention=attention_kernel(config, hlo),
        compile_seconds=seconds,
        cost_source=source,
    )
    c.peak = c.argument + c.output - c.alias + c.temp
    return c


def collectives_per_step(c: Compiled, loop_trips: int = 1) -> dict[str, tuple[int, float]]:
    """Each collective kind's (count, bytes per device) in one run of the program: one inside
    the loop counted ``loop_trips`` times (the micro-batches; XLA's text holds it once)."""
    out = {}
    for x in c.collectives:
        count = x["count"] - x["in_loop"] + x["in_loop"] * loop_trips
        out[x["kind"]] = (count, x["bytes"] / max(x["count"], 1) * count)
    return out


def roofline_seconds(c: Compiled, d: Device, loop_trips: int = 1) -> float:
    """The roofline lower bound of a compiled program's time: max(FLOPs ÷ peak, bytes
    accessed ÷ HBM bandwidth) per device, plus the collectives' bytes ÷ link bandwidth
    (all-reduce bytes twice: reduce, then gather), nothing overlapped and no efficiency lost:
    a real step is slower. ``loop_trips``: the trips of its loop (the micro-batches), whose
    body XLA counts once (see the module docstring)."""
    link = sum(
        b * (2 if kind == "all-reduce" else 1)
        for kind, (_, b) in collectives_per_step(c, loop_trips).items()
    )
    compute = c.xla_flops * loop_trips / d.flops
    # bytes before fusion overstate the traffic: left out, so the bound stays a lower bound
    exact = c.cost_source == "compiled"
    memory = c.bytes_accessed * loop_trips / d.memory_bandwidth if exact else 0.0
    return max(compute, memory) + link / d.link_bandwidth


def device_of(kind: str) -> Device | None:
    """The ``DEVICES`` entry of a JAX ``device_kind`` (``NVIDIA H100 80GB HBM3``,
    ``TPU v5 lite``), or None."""
    names = {"h100": ("H100",), "v5e": ("v5 lite", "v5e"), "v5p": ("v5p",), "v6e": ("v6",)}
    return next((DEVICES[k] for k, subs in names.items() if any(s in kind for s in subs)), None)


# -- the plan -------------------------------------------------------------------------------
@dataclasses.dataclass
class Plan:
    """A config compiled for a target on one mesh; see ``to_json`` for the figures."""

    target: Target
    mesh: tuple[int, int, int]
    accum: int
    rows: int
    max_len: int
    train: Compiled
    decode: Compiled | None
    decode_shape: tuple[int, int, int] = (0, 0, 0)  # rows, source width, output limit
    analytic_flops: float = 0.0  # per step, all devices (seq2seq.model.flops)

    @property
    def devices(self) -> int:
        return math.prod(self.mesh)

    @property
    def fits(self) -> bool:
        usable = self.target.figures.memory * self.target.figures.usable
        steps = [self.train] + ([self.decode] if self.decode else [])
        return all(not s.error and s.peak <= usable for s in steps)

    @property
    def headroom(self) -> float:
        """Usable device memory minus the train step's peak, bytes (negative: short)."""
        return self.target.figures.memory * self.target.figures.usable - self.train.peak

    @property
    def flops_per_step(self) -> float:
        """XLA's FLOPs of the whole step over all devices (× micro-batches, see module)."""
        return self.train.xla_flops * self.devices * self.accum

    @property
    def step_seconds(self) -> float:
        """``roofline_seconds`` of the train step."""
        return roofline_seconds(self.train, self.target.figures, self.accum)

    @property
    def target_tokens(self) -> int:
        """Target positions per step (padding included: the batch's shape)."""
        return self.accum * self.rows * self.max_len

    def to_json(self) -> dict[str, Any]:
        d = self.target.figures
        train = dataclasses.asdict(self.train)
        return {
            "target": self.target.name,
            "device": dataclasses.asdict(d),
            "devices": self.devices,
            "mesh": dict(zip(MESH_AXES, self.mesh)),
            "micro_batches": self.accum,
            "batch": [self.accum, self.rows, self.max_len],
            "peak_bytes": self.train.peak,
            "device_memory": d.memory,
            "usable_memory": d.memory * d.usable,
            "fits": self.fits,
            "headroom_bytes": self.headroom,
            "xla_flops": self.flops_per_step,
            "analytic_flops": self.analytic_flops,
            "flops_ratio": self.flops_per_step / self.analytic_flops
            if self.analytic_flops
            else None,
            "step_seconds": None if self.train.error else self.step_seconds,
            "target_tokens_per_second": None
            if self.train.error
            else self.target_tokens / self.step_seconds,
            "train": train,
            "decode": None if self.decode is None else dataclasses.asdict(self.decode),
            "decode_shape": list(self.decode_shape),
        }


def _decode_program(context: TrainContext) -> tuple[Any, tuple[int, int, int]]:
    """The test decode's chunk at the bucket of ``data.max_len``, lowered: the strategy of
    ``decode.search`` (beam at ``decode.beam_size``) on a full ``decode.max_tokens`` chunk."""
    config, p = context.config, context.partitioner
    limit = decode_source_limit(config)
    width = bucket_length(min(config.data.max_len, limit), limit)
    budget = max(1, config.decode.max_tokens // width)
    rows = chunk_rows(budget, width, config.decode.max_tokens, p.batch_shards)
    ids = SimpleNamespace(pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID)
    rules = chunk_rules(config.decode, ids, width, np.full(rows, width))
    shardings = context.shardings.params
    params = p.abstract(context.abstract.params)
    lowered: list[Any] = []

    def run(search, inputs, **static):  # the Translator's Run, lowering instead of running
        static.setdefault("graphdef", context.graphdef)
        step = search_step(p, shardings, search, static)
        rows_in = tuple(
            jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype, sharding=p.batch_sharding)
            for x in inputs
        )
        low = step.lower(params, rows_in)
        lowered.append(low)
        return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), low.out_info)

    src = [np.zeros((rows, width), np.int32), np.ones((rows, width), np.int32)]
    strategy(config.decode).search(run, src, rules, line_ids=np.arange(rows), nbest=1)
    return lowered[0], (rows, width, rules.max_len)


def plan(
    config: Config,
    target_name: str,
    mesh: Sequence[int] | None = None,
    *,
    decode: bool = True,
    train: Compiled | None = None,
) -> Plan:
    """Compile ``config``'s train step (and, with ``decode``, its test decode's chunk) for
    ``target_name`` on ``mesh`` (data, fsdp, tensor; None: the config's ``mesh`` section).
    ``train``: the train step's figures from an earlier compile on this mesh, kept as they are.

    Raises:
      ConfigError: an unknown target. MeshError: a mesh that does not fit the devices, the
        model or the batch. RuntimeError: the target's compiler is not installed.
    """
    t = target(target_name)
    devices = compile_only_devices(t)
    partitioner = partitioner_for(config, devices, mesh)
    context = train_context(config, partitioner)
    accum, rows, length = context.batch_shape()
    programs = [] if train is not None else [context.lower()]
    shape = (0, 0, 0)
    if decode:
        lowered, shape = _decode_program(context)
        programs.append(lowered)
    # two compiles at once: XLA compiles outside the GIL, and the step's dominates
    with ThreadPoolExecutor(max(1, len(programs))) as pool:
        n = len(devices)
        compiled = list(pool.map(lambda low: compile_lowered(low, config, n), programs))
    if train is None:
        train = compiled.pop(0)
    dec = compiled
    analytic = train_flops_per_step(config.model, accum * rows, length, length)
    sizes = tuple(int(partitioner.mesh.shape[a]) for a in MESH_AXES)
    return Plan(t, sizes, accum, rows, length, train, dec[0] if dec else None, shape, analytic)  # type: ignore[arg-type]


def micro_batch_options(config: Config, shards: int) -> list[int]:
    """Ways to split each step's batch into more micro-batches ``k`` with the same tokens
    per step: ``data.max_tokens`` ÷ k per micro-batch, ``train.grad_accum_steps`` × k, each
    micro-batch's rows still divisible by ``shards`` (data × fsdp). Ascending, 1 first."""
    rows = batch_rows(config.data)
    return [k for k in range(1, rows + 1) if rows % k == 0 and (rows // k) % shards == 0]


def with_micro_batches(config: Config, k: int) -> Config:
    """``config`` with its step's batch split into ``k`` times more micro-batches."""
    d, t = config.data, config.train
    return replace(
        config,
        **{
            "data.max_tokens": batch_rows(d) // k * d.max_len,
            "train.grad_accum_steps": t.grad_accum_steps * k,
        },
    )


def meshes(config: Config, devices: int) -> list[tuple[int, int, int]]:
    """Every (data, fsdp, tensor) with product ``devices`` that the model and batch allow:
    ``tensor`` divides ``model.num_heads`` and ``model.d_ff``, ``data × fsdp`` the rows."""
    m, rows = config.model, batch_rows(config.data)
    out = []
    for data, fsdp in itertools.product(range(1, devices + 1), repeat=2):
        if devices % (data * fsdp):
            continue
        tensor = devices // (data * fsdp)
        if m.num_heads % tensor or m.d_ff % tensor or rows % (data * fsdp):
            continue
        out.append((data, fsdp, tensor))
    return out


@dataclasses.dataclass
class Search:
    """``search``'s outcome: ``ranked`` (the meshes that fit, fastest first), ``tried``
    (every compiled candidate in the order compiled) and the default mesh's plan."""

    ranked: list[tuple[Config, Plan]]
    tried: list[tuple[Config, Plan]]
    default: Plan | None


def search(
    config: Config,
    target_name: str,
    *,
    max_micro_batches: int = 16,
    progress: Any = None,
    jobs: int | None = None,
) -> Search:
    """The mesh planner: each (data, fsdp, tensor) factorisation of the target's devices
    (``meshes``) with the fewest extra micro-batches that fit (``micro_batch_options``,
    at most ``max_micro_batches`` times more; more micro-batches only cost time), ranked by
    the predicted step time. The decode is compiled for the chosen mesh only.
    ``progress(line)`` is told of each compile; ``jobs`` meshes compile at once (None: one per
    core).

    Raises:
      ConfigError / RuntimeError: as ``plan``.
    """
    t = target(target_name)
    n = len(compile_only_devices(t))
    default = None

    def candidates(shape: tuple[int, int, int]) -> list[tuple[Config, Plan]]:
        out = []
        for k in micro_batch_options(config, shape[0] * shape[1]):
            if k > max_micro_batches:
                break
            cfg = config if k == 1 else with_micro_batches(config, k)
            p = plan(cfg, target_name, shape, decode=False)
            # JAX's caches keep each candidate's lowering: ~0.4 GB a compile of a 40M-parameter
            # model, 9 GB over a Transformer base search; cleared, about a third of that
            jax.clear_caches()
            out.append((cfg, p))
            if progress is not None:
                progress(f"  {format_row(p)}")
            if p.fits:
                break
        return out

    # one mesh per core at a time: a compile keeps about one core busy, outside the GIL
    with ThreadPoolExecutor(jobs or os.cpu_count() or 1) as pool:
        tried = [x for found in pool.map(candidates, meshes(config, n)) for x in found]
    ranked = sorted((x for x in tried if x[1].fits), key=lambda x: x[1].step_seconds)
    if ranked:
        cfg, best = ranked[0]
        ranked[0] = (cfg, plan(cfg, target_name, best.mesh, train=best.train))
    try:  # the config's own mesh, compiled above unless it is not a factorisation tried
        mine = mesh_shape(config.mesh, n)
        default = next((p for c, p in tried if p.mesh == mine and c is config), None)
        default = default or plan(config, target_name, decode=False)
    except MeshError:
        default = None
    return Search(ranked, tried, default)


# -- text -----------------------------------------------------------------------------------
def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def format_row(p: Plan) -> str:
    """One line: mesh, micro-batches, peak, fits, step time."""
    mesh = "×".join(str(x) for x in p.mesh)
    fit = "fits" if p.fits else "does NOT fit"
    time_ = "" if p.train.error else f", ≥ {p.step_seconds * 1e3:.1f} ms/step"
    peak = _gb(p.train.peak)
    return f"mesh {mesh} (data×fsdp×tensor), {p.accum} micro-batch(es): peak {peak} {fit}{time_}"


def format_plan(p: Plan, config: Config) -> str:
    """The report ``seq2seq-plan`` prints."""
    d = p.target.figures
    usable = d.memory * d.usable
    lines = [
        f"target {p.target.name}: {p.devices} × {d.name} (compile-only, {p.target.platform}); "
        f"mesh data={p.mesh[0]} fsdp={p.mesh[1]} tensor={p.mesh[2]}",
        f"train step: {p.accum} micro-batch(es) of {p.rows} rows × {p.max_len} tokens; "
        f"model.dtype={config.model.dtype}, matmul_dtype={config.model.matmul_dtype}",
    ]
    for name, c in (("train step", p.train), ("decode chunk", p.decode)):
        if c is None:
            continue
        lines.append(f"{name}, per device:")
        if c.error:
            lines.append(f"  does NOT fit: the compiler refused it: {c.error}")
            continue
        lines += [
            f"  memory: arguments {_gb(c.argument)}, outputs {_gb(c.output)} "
            f"({_gb(c.alias)} donated), temporaries {_gb(c.temp)}, code {_gb(c.code)}",
            f"  peak {_gb(c.peak)} of {_gb(usable)} usable ({_gb(d.memory)} × {d.usable:g}): "
            + (f"fits, {_gb(usable - c.peak)} headroom" if c.peak <= usable else "does NOT fit"),
            f"  XLA: {c.xla_flops / 1e9:.2f} GFLOP, {c.bytes_accessed / 1e9:.2f} GB accessed "
            + (
                "(a loop body counted once)"
                if c.cost_source == "compiled"
                else "(the program before partitioning and fusion, ÷ devices)"
            )
            + f"; compiled in {c.compile_seconds:.0f} s",
            "  collectives: "
            + (
                ", ".join(
                    f"{x['kind']} ×{x['count']} ({x['bytes'] / 1e6:.1f} MB"
                    + (f"; {x['in_loop']} in a loop" if x["in_loop"] else "")
                    + ")"
                    for x in c.collectives
                )
                or "none"
            ),
            f"  attention: {c.attention}",
        ]
    if p.decode is not None:
        r, w, m = p.decode_shape
        lines.append(
            f"  (decode chunk: {strategy(config.decode).describe()}, {r} sentences × {w} "
            f"source tokens, output limit {m})"
        )
    if not p.train.error:
        ratio = p.flops_per_step / p.analytic_flops if p.analytic_flops else float("nan")
        lines += [
            f"FLOPs per step: XLA {p.flops_per_step / 1e12:.3f} T, analytic "
            f"{p.analytic_flops / 1e12:.3f} T (seq2seq/model/flops.py; ratio {ratio:.3f})",
            f"predicted step ≥ {p.step_seconds * 1e3:.2f} ms, ≤ "
            f"{p.target_tokens / p.step_seconds:,.0f} target tokens/s (padding included): a "
            f"roofline lower bound assuming {d.flops / 1e12:g} TFLOP/s bf16, "
            f"{d.memory_bandwidth / 1e9:g} GB/s HBM, {d.link_bandwidth / 1e9:g} GB/s links "
            f"per device ({d.source})",
        ]
    lines.append(f"fits: {'yes' if p.fits else 'NO'}")
    return "\n".join(lines)


def format_search(s: Search) -> str:
    """The planner's table, the chosen mesh first; or why none fits."""
    lines = []
    if s.default is not None:
        lines.append(f"default: {format_row(s.default)}")
    if not s.ranked:
        lines.append(
            f"no mesh fits: {len(s.tried)} candidates compiled, none within the device's "
            "memory; lower data.max_tokens or the model, or take a larger target"
        )
        return "\n".join(lines)
    head = (
        "| rank | mesh (data×fsdp×tensor) | micro-batches | peak | headroom | step ≥ | tokens/s ≤ |"
    )
    lines += ["", head, "|--:|---|--:|--:|--:|--:|--:|"]
    for i, (_, p) in enumerate(s.ranked, 1):
        lines.append(
            f"| {i} | {'×'.join(map(str, p.mesh))} | {p.accum} | {_gb(p.train.peak)} | "
            f"{_gb(p.headroom)} | {p.step_seconds * 1e3:.2f} ms | "
            f"{p.target_tokens / p.step_seconds:,.0f} |"
        )
    cfg, best = s.ranked[0]
    lines.append(
        f"\nchosen: mesh.data={best.mesh[0]} mesh.fsdp={best.mesh[1]} mesh.tensor={best.mesh[2]}"
        f" data.max_tokens={cfg.data.max_tokens} train.grad_accum_steps="
        f"{cfg.train.grad_accum_steps}"
    )
    return "\n".join(lines)
