"""Device mesh, sharding rules and sharded compiled steps: data, FSDP and tensor parallelism.

One program runs on every device (SPMD): ``jax.jit`` with explicit ``in_shardings`` and
``out_shardings`` over a ``jax.sharding.Mesh`` with axes ``("data", "fsdp", "tensor")``; XLA's
partitioner (GSPMD, Xu et al. 2021) inserts the collectives. Parameters carry logical axis names
(``seq2seq.model.axes``); the table ``RULES`` below is the only place that says which mesh axis
holds which logical axis.

* ``data``: batch rows split, parameters replicated, gradients all-reduced.
* ``fsdp``: batch rows split, and parameters and optimizer state stored split along ``embed``
  (ZeRO-3 storage, Rajbhandari et al. 2020): each device keeps 1/fsdp of the parameters and
  of the Adam moments and updates only its part. Inside a step the parameters are all-gathered
  over ``fsdp`` where they are used (``compute_layout``), and their gradients are summed over the
  batch shards; without that constraint XLA tends to split the matmuls along ``embed`` instead
  and moves activations, which costs several times more (``benchmarks/comm_cost.py``).
* ``tensor``: Megatron-style (Shoeybi et al. 2019): Q/K/V columns and output-projection rows
  split by head, FFN ``W1`` columns and ``W2`` rows split by hidden unit, and the shared
  embedding / output projection split by vocabulary entry ("vocab-parallel": logits stay split
  over the vocabulary, and the softmax needs only ``[batch, length]`` all-reduces instead of
  gathering ``[batch, length, vocab]`` logits).

Multi-host: ``initialize_distributed`` starts ``jax.distributed``; every process builds the same
global mesh, runs the same compiled program, and feeds only its own rows of each global batch
(``jax.make_array_from_process_local_data``). Orbax saves and restores the sharded arrays from
all processes.

Usage (what ``seq2seq.training.loop`` does)::

    p = Partitioner.from_config(config)
    graphdef, abstract = abstract_train_state(config)
    state = p.init_state(init_fn, abstract)  # or: checkpointer.restore(p.abstract(abstract))
    shardings = p.shardings(abstract)
    train_step = make_train_step(graphdef, tx, ..., param_layout=p.compute_layout(shardings.params))
    step = p.jit(train_step, shardings, out_shardings=(shardings, p.replicated), donate=True)
    state, metrics = step(state, p.shard_batch(numpy_batch))
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

log = logging.getLogger(__name__)
_K = TypeVar("_K")  # the keys of a batch (shard_batch keeps them)

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Logical axis (seq2seq.model.axes) → mesh axes; None = replicated. The one table.
RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", BATCH_AXES),  # rows of every batch and decoding input (activations follow them)
    ("vocab", "tensor"),  # embedding rows = output-projection columns (vocab-parallel logits)
    ("embed", "fsdp"),  # d_model: FSDP splits every weight and its Adam moments along it
    ("heads", "tensor"),  # heads × head_dim: Q/K/V columns, output-projection rows
    ("mlp", "tensor"),  # d_ff: FFN W1 columns, W2 rows
    ("positions", None),  # rows of a learned position table (model.max_len): small, replicated
    ("relpos_buckets", None),  # T5 relative-position buckets: a [heads, buckets] table
)


class MeshError(ValueError):
    """The configured mesh does not fit the devices or the model; the message says why."""


# -- the mesh ------------------------------------------------------------------------------
def mesh_shape(config, num_devices: int) -> tuple[int, int, int]:
    """Resolve a ``MeshConfig`` (``data``, ``fsdp``, ``tensor``; one may be -1) to sizes.

    Args:
      config: anything with int attributes ``data``, ``fsdp``, ``tensor``.
      num_devices: devices of all processes (``jax.device_count()``).

    Returns:
      ``(data, fsdp, tensor)`` whose product is ``num_devices``.

    Raises:
      MeshError: a size is 0 or below -1, more than one is -1, or the sizes do not multiply to
        the device count (the message gives both).
    """
    sizes = [getattr(config, a) for a in MESH_AXES]
    named = ", ".join(f"{a}={s}" for a, s in zip(MESH_AXES, sizes))
    if any(s == 0 or s < -1 for s in sizes):
        raise MeshError(f"mesh sizes must be positive or -1, got {named}")
    if sizes.count(-1) > 1:
        raise MeshError(f"at most one mesh size may be -1 (the remaining devices), got {named}")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if num_devices % known:
            raise MeshError(f"mesh {named}: {num_devices} devices are not divisible by {known}")
        sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise MeshError(
            f"mesh {named} needs {math.prod(sizes)} devices but there are "
            f"{num_devices}; set one size to -1 or change the sizes"
        )
    return tuple(sizes)


def make_mesh(config, devices: list | None = None) -> Mesh:
    """A ``Mesh`` with axes ``("data", "fsdp", "tensor")`` from a ``MeshConfig``.

    Devices are ordered by ``jax.make_mesh`` (topology-aware on TPU; process-major on GPU/CPU,
    so ``tensor``, the innermost axis, stays within a host). Axis types are ``Auto``: shardings
    are given on the jit boundaries and XLA propagates them inside.

    Args:
      config: ``MeshConfig``.
      devices: devices to use (default: ``jax.devices()``, those of all processes).

    Raises:
      MeshError: see ``mesh_shape``.
    """
    devices = jax.devices() if devices is None else list(devices)
    shape = mesh_shape(config, len(devices))
    return jax.make_mesh(
        shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices
    )


def check_model(model_config, mesh: Mesh) -> None:
    """Check that tensor parallelism splits whole heads and FFN units.

    A dimension that a mesh axis does not divide is replicated (see ``logical_to_mesh``), but a
    head split across devices would be silently slow, so that is an error.

    Raises:
      MeshError: ``num_heads`` or ``d_ff`` is not divisible by the ``tensor`` size.
    """
    t = mesh.shape["tensor"]
    for name in ("num_heads", "d_ff"):
        value = getattr(model_config, name)
        if value % t:
            raise MeshError(f"model.{name}={value} is not divisible by mesh.tensor={t}")


# -- logical → mesh ------------------------------------------------------------------------
@functools.cache
def _warn_replicated(name: str, size: int, axes: tuple[str, ...], parts: int) -> None:
    log.warning(
        "logical axis %r of size %d is not divisible by mesh axes %s (%d); replicated",
        name,
        size,
        axes,
        parts,
    )


def logical_to_mesh(spec: P, shape: tuple[int, ...], mesh: Mesh, rules: tuple = RULES) -> P:
    """Map a logical ``PartitionSpec`` (e.g. ``P("embed", "mlp")``) to mesh axes by ``rules``.

    A mesh axis is used at most once per array (a later dimension asking for a taken axis is
    replicated), and a dimension that its mesh axes do not divide is replicated (warned once).

    Args:
      spec: logical names per dimension (``None`` = replicated); shorter specs pad with None.
      shape: the array's shape.
      mesh: the target mesh.
      rules: ``(logical, mesh axes)`` pairs.

    Returns:
      A ``PartitionSpec`` over mesh axis names.

    Raises:
      KeyError: a logical name has no rule.
    """
    table = dict(rules)
    used: set[str] = set()
    out: list[str | tuple[str, ...] | None] = []
    for dim, name in enumerate(tuple(spec) + (None,) * (len(shape) - len(spec))):
        if name is None:
            out.append(None)
            continue
        if name not in table:
            raise KeyError(f"logical axis {name!r} has no sharding rule; add it to RULES")
        target = table[name]
        axes = () if target is None else (target,) if isinstance(target, str) else tuple(target)
        axes = tuple(a for a in axes if a not in used)
        parts = math.prod(mesh.shape[a] for a in axes)
        if not axes or parts == 1:
            out.append(None)
            continue
        if shape[dim] % parts:
            _warn_replicated(name, shape[dim], axes, parts)
            out.append(None)
            continue
        used.update(axes)
        out.append(axes[0] if len(axes) == 1 else axes)
    while out and out[-1] is None:
        out.pop()
    return P(*out)


def format_rules(rules: tuple = RULES) -> str:
    """The rules as a Markdown table (``python -m seq2seq.sharding`` prints it)."""
    lines = ["| logical axis | mesh axes |", "|---|---|"]
    for name, target in rules:
        shown = (
            "replicated"
            if target is None
            else " × ".join((target,) if isinstance(target, str) else target)
        )
        lines.append(f"| `{name}` | {shown} |")
    return "\n".join(lines)


# -- multi-host ----------------------------------------------------------------------------
def initialize_distributed(config) -> bool:
    """Start ``jax.distributed`` for a multi-process run; a no-op for a single process.

    Must run before anything touches the devices. Idempotent.

    Args:
      config: ``DistributedConfig``. Initialises when ``auto`` is true (JAX detects SLURM,
        Open MPI, TPU pods, ``JAX_COORDINATOR_ADDRESS``), or ``coordinator_address`` is set,
        or ``num_processes`` > 1; explicit values override detected ones.

    Returns:
      True if this call (or an earlier one) initialised the distributed runtime.
    """
    if jax.distributed.is_initialized():
        return True
    explicit = config.coordinator_address is not None or (config.num_processes or 1) > 1
    if not (config.auto or explicit):
        return False
    jax.distributed.initialize(
        coordinator_address=config.coordinator_address,
        num_processes=config.num_processes,
        process_id=config.process_id,
        initialization_timeout=config.initialization_timeout,
    )
    log.info(
        "jax.distributed: process %d of %d, %d local / %d global devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )
    return True


def is_main_process() -> bool:
    """True on process 0 (the one that writes logs, metrics and reports)."""
    return jax.process_index() == 0


@contextlib.contextmanager
def main_process_first(name: str) -> Iterator[None]:
    """Run the block on process 0 first, then on the others (e.g. train a tokenizer once).

    A no-op with one process; otherwise a barrier named ``name`` separates the two turns.
    """
    if jax.process_count() == 1:
        yield
        return
    if not is_main_process():
        wait_for_all(name)
    yield
    if is_main_process():
        wait_for_all(name)


BARRIER_TIMEOUT_S = 6 * 3600  # process 0 may tokenize a WMT-size corpus meanwhile
_barriers = itertools.count()


def wait_for_all(name: str, timeout_s: int = BARRIER_TIMEOUT_S) -> None:
    """A barrier of every process, through ``jax.distributed``'s coordination service (no
    device collective: those give up after about 30 s on the CPU, while process 0 may prepare
    a large corpus for minutes). Every process must call it in the same order.

    Raises:
      RuntimeError: (from JAX) a process did not arrive within ``timeout_s``.
    """
    from jax._src import distributed  # the client orbax's barriers use too

    client = distributed.global_state.client
    if client is None:  # not started by jax.distributed.initialize: devices' barrier
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
        return
    client.wait_at_barrier(f"seq2seq/{name}/{next(_barriers)}", timeout_s * 1000)


def agree_on_steps(steps: int) -> int:
    """The smallest of every process's ``steps`` (``train.time_budget``'s choice, made from
    each process's own clock), so that all of them run the same number of steps. With one
    process, ``steps`` unchanged, without any collective."""
    if jax.process_count() == 1:
        return steps
    from jax.experimental import multihost_utils

    every = np.asarray(multihost_utils.process_allgather(np.array([steps], np.int64)))
    return int(every.min())


def agree_to_stop(signum: int | None, out_of_time: bool) -> tuple[int | None, bool]:
    """Combine every process's stop flags into one decision that all processes share.

    The training loop calls this once per step, at the same point on every process, so that
    all of them stop after the same step and enter the checkpoint save together; a process
    that stopped alone would wait in the save while the others wait in the next step's
    collectives, and the job would hang or crash instead of saving.

    Args:
      signum: the signal this process received (SIGINT/SIGTERM), or None.
      out_of_time: whether this process has reached ``train.max_seconds``.

    Returns:
      ``(signum, out_of_time)`` agreed by all processes: the largest signal number any process
      received (so SIGTERM, 15, wins over SIGINT, 2, the same on every process), or None if
      none did; and True if any process is out of time. With one process, the arguments
      unchanged, without any collective.
    """
    if jax.process_count() == 1:
        return signum, out_of_time
    from jax.experimental import multihost_utils

    mine = np.array([signum or 0, int(out_of_time)], np.int32)
    every = np.asarray(multihost_utils.process_allgather(mine))  # [processes, 2]
    agreed = int(every[:, 0].max())
    return (agreed or None), bool(every[:, 1].any())


# -- placement and compiled steps ----------------------------------------------------------
class Partitioner:
    """Places arrays on a mesh by the rules and compiles steps with explicit shardings.

    Args:
      mesh: a mesh with axes ``MESH_AXES`` (``make_mesh``).
      rules: logical → mesh table (default ``RULES``).
    """

    def __init__(self, mesh: Mesh, rules: tuple = RULES):
        if tuple(mesh.axis_names) != MESH_AXES:
            raise MeshError(f"mesh axes must be {MESH_AXES}, got {mesh.axis_names}")
        self.mesh, self.rules = mesh, rules
        self.batch_sharding = NamedSharding(mesh, P(dict(rules)["batch"]))
        self.replicated = NamedSharding(mesh, P())
        self.batch_shards = math.prod(mesh.shape[a] for a in self.batch_sharding.spec[0])

    @classmethod
    def from_config(cls, config) -> Partitioner:
        """The partitioner of a run: its ``mesh`` section over all devices, checked against
        its ``model`` section.

        Raises:
          MeshError: see ``mesh_shape`` and ``check_model``.
        """
        mesh = make_mesh(config.mesh)
        check_model(config.model, mesh)
        return cls(mesh)

    @classmethod
    def single_device(cls) -> Partitioner:
        """A mesh of this process's first device (everything on one device)."""
        return cls(
            jax.make_mesh(
                (1, 1, 1),
                MESH_AXES,
                axis_types=(AxisType.Auto,) * 3,
                devices=jax.local_devices()[:1],
            )
        )

    def __repr__(self) -> str:
        sizes = ", ".join(f"{a}={n}" for a, n in self.mesh.shape.items())
        return f"Partitioner({sizes}; {jax.process_count()} process(es))"

    # shardings --------------------------------------------------------------------------
    def shardings(self, tree: Any) -> Any:
        """``NamedSharding`` for every array of a pytree carrying nnx partition metadata.

        Works on a ``TrainState``, an ``nnx.State`` of parameters, or their abstract
        (``jax.eval_shape``) versions: ``nnx.Param`` leaves, including the Adam moments that
        mirror them in the optimizer state, are placed by their logical names; every other
        leaf (step, counts, RNG key, scalars) is replicated.

        Returns:
          A pytree of ``NamedSharding`` with the structure of ``tree``.
        """
        specs = nnx.get_partition_spec(tree)

        def to_sharding(spec, leaf):
            spec = logical_to_mesh(spec, leaf.shape, self.mesh, self.rules)
            return NamedSharding(self.mesh, spec)

        return jax.tree.map(to_sharding, specs, tree, is_leaf=lambda x: isinstance(x, P))

    def abstract(self, tree: Any) -> Any:
        """``tree`` as ``jax.ShapeDtypeStruct`` with shardings: the target for a sharded orbax
        restore (each process reads only its shards)."""
        return jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            tree,
            self.shardings(tree),
        )

    def place(self, tree: Any) -> Any:
        """Put a pytree of arrays on the mesh by the rules.

        Arrays already placed so are kept; host or single-device arrays (which every process
        must hold with equal values) are cut into the shards this process owns; other global
        arrays are resharded.
        """

        def put(x, sharding):
            if isinstance(x, jax.Array) and x.sharding == sharding:
                return x
            if not isinstance(x, jax.Array) or x.is_fully_addressable:
                host = np.asarray(x)
                return jax.make_array_from_callback(host.shape, sharding, lambda i: host[i])
            return jax.device_put(x, sharding)

        return jax.tree.map(put, tree, self.shardings(tree))

    def init_state(self, init_fn: Callable[[], Any], abstract: Any) -> Any:
        """Run ``init_fn()`` compiled with its outputs sharded like ``abstract``: each device
        creates only its shards (no full copy of the model on one device).

        Args:
          init_fn: builds the initial state (e.g. model + ``create_train_state``).
          abstract: ``jax.eval_shape(init_fn)`` (the structure and partition metadata).
        """
        return jax.jit(init_fn, out_shardings=self.shardings(abstract))()

    # batches -----------------------------------------------------------------------------
    def process_rows(self, num_rows: int) -> np.ndarray:
        """Indices of the global batch rows this process feeds, ascending.

        With process-major device order this is ``[pid·R/n, (pid+1)·R/n)`` for R rows and n
        processes whose devices split the rows; processes that are replicas along the batch
        (e.g. a tensor axis spanning hosts) feed the same rows.

        Raises:
          MeshError: ``num_rows`` is not divisible by ``data × fsdp``.
        """
        if num_rows % self.batch_shards:
            raise MeshError(
                f"{num_rows} batch rows are not divisible by data × fsdp = "
                f"{self.batch_shards}; change data.max_tokens or the mesh"
            )
        index_map = self.batch_sharding.addressable_devices_indices_map((num_rows,))
        covered: set[int] = set()
        for idx in index_map.values():
            assert idx is not None  # a NamedSharding gives every addressable device its slice
            covered.update(range(num_rows)[idx[0]])
        rows = sorted(covered)
        return np.asarray(rows)

    def rows_sharding(self, row_axis: int = 0) -> NamedSharding:
        """Sharding of arrays whose axis ``row_axis`` holds batch rows (split over
        ``data × fsdp``), e.g. ``row_axis=1`` for micro-batches ``[accum, rows, length]``."""
        if row_axis == 0:
            return self.batch_sharding
        return NamedSharding(self.mesh, P(*([None] * row_axis), self.batch_sharding.spec[0]))

    def process_share(self, num_rows: int) -> tuple[int, int]:
        """``(index, count)``: this process feeds the ``index``-th of ``count`` equal,
        contiguous blocks of a batch of ``num_rows`` rows (``process_rows``), as
        ``PackedBatches.batch_at(step, index, count)`` lays them out; ``(0, 1)`` (the whole
        batch) when its rows are not such a block.

        Raises:
          MeshError: ``num_rows`` is not divisible by ``data × fsdp``.
        """
        rows = self.process_rows(num_rows)
        n, first = len(rows), int(rows[0])
        block = n and num_rows % n == 0 and first % n == 0
        if block and np.array_equal(rows, np.arange(first, first + n)):
            return first // n, num_rows // n
        return 0, 1

    def shard_batch(
        self, batch: Mapping[_K, np.ndarray], row_axis: int = 0, global_rows: int | None = None
    ) -> dict[_K, jax.Array]:
        """Global arrays split by rows over ``data × fsdp`` from a host batch.

        Batch k is a function of (seed, k), so each process can lay out the global batch, or
        only its own rows, and hands ``jax.make_array_from_process_local_data`` its rows.

        Args:
          batch: arrays whose axis ``row_axis`` has equal length: ``[rows, ...]`` or
            micro-batches ``[accum, rows, ...]``; either the global batch's ``rows``
            (divisible by data × fsdp) or, with ``global_rows``, possibly only this process's
            rows (``process_rows(global_rows)``, e.g. from ``process_share``).
          global_rows: rows of the global batch (None: ``batch`` is the global batch).

        Raises:
          MeshError: the rows are not divisible by data × fsdp, or ``batch`` holds neither
            the global batch nor this process's rows of it.
        """
        first = next(iter(batch.values()))
        have = np.shape(first)[row_axis]
        total = have if global_rows is None else global_rows
        rows = self.process_rows(total)
        sharding = self.rows_sharding(row_axis)
        if have == total:
            local = {k: np.take(np.asarray(v), rows, axis=row_axis) for k, v in batch.items()}
        elif have == len(rows):
            local = {k: np.asarray(v) for k, v in batch.items()}
        else:
            raise MeshError(
                f"a host batch of {have} rows is neither the global batch ({total} rows) nor "
                f"this process's {len(rows)} rows of it"
            )
        return {
            k: jax.make_array_from_process_local_data(
                sharding, v, (*v.shape[:row_axis], total, *v.shape[row_axis + 1 :])
            )
            for k, v in local.items()
        }

    def compute_layout(self, shardings: Any) -> Any:
        """The layout parameters compute in: ``shardings`` with ``fsdp`` removed (gathered),
        tensor parallelism kept. The steps constrain their parameters to it once per call
        (``param_layout`` of ``make_train_step``), not in every layer or loop step."""

        def drop(sharding):
            spec = [
                tuple(a for a in (e if isinstance(e, tuple) else (e,)) if a != "fsdp")
                if e is not None
                else ()
                for e in sharding.spec
            ]
            return NamedSharding(
                self.mesh, P(*[e[0] if len(e) == 1 else (e or None) for e in spec])
            )

        return jax.tree.map(drop, shardings)

    # compiling a step --------------------------------------------------------------------
    def jit(
        self,
        fn: Callable,
        shardings: Any,
        *,
        row_axis: int = 0,
        out_shardings: Any = None,
        donate: bool = False,
        scalars: int = 0,
    ) -> Callable:
        """``fn(x, rows)`` compiled over the mesh: the one way a step is compiled here.

        Args:
          fn: a pure function of ``x`` (parameters or a ``TrainState``) and ``rows`` (a pytree
            of arrays whose axis ``row_axis`` holds batch rows or sentences).
          shardings: the shardings ``x`` comes in with (``shardings(x)``).
          row_axis: the rows' axis, split over ``data × fsdp`` (1 for micro-batches
            ``[accum, rows, length]``).
          out_shardings: the outputs' shardings; default: replicated, so every process reads
            them without a gather (metrics, token ids, scores).
          donate: donate ``x`` (a train state updated in place).
          scalars: ``fn`` takes this many more arguments after ``rows``, replicated (e.g. the
            schedule's horizon: values that change without a recompilation).
        """
        return jax.jit(
            fn,
            in_shardings=(shardings, self.rows_sharding(row_axis), *[self.replicated] * scalars),
            out_shardings=self.replicated if out_shardings is None else out_shardings,
            donate_argnums=(0,) if donate else (),
        )


if __name__ == "__main__":
    print(format_rules())
