"""Checkpoints with orbax-checkpoint: train state + JSON bookkeeping, saved atomically.

Layout: ``workdir/checkpoints/<step>/{state,meta[,metrics]}``. Orbax writes each step into a
temporary directory (``<step>.orbax-checkpoint-tmp-*``) and renames it when complete, so a crash
mid-save leaves the previous checkpoint intact and the half-written one is ignored (the training
process removes it when it starts again, ``cleanup_tmp``, and names its step in the log and in
``summary.md``: ``discarded_message``). No pickle is used: arrays go to
tensorstore/zarr, bookkeeping to JSON.

Retention: the last ``keep`` checkpoints, plus (with ``best_mode``) the one whose ``metric``
is best, through orbax preservation policies. Arrays are restored onto the current devices
whatever the device count or mesh they were saved from.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocm

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be restored into the current model; the message lists why."""


def _placed(abstract_state: Any) -> Any:
    """``abstract_state`` as ShapeDtypeStructs, each with a sharding (default: first device)."""
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def leaf(x):
        sharding = getattr(x, "sharding", None)
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding or device)

    return jax.tree.map(leaf, abstract_state)


def _path(keys) -> str:
    """A pytree path as ``a.b.0.c`` whatever the key types (dict, sequence, attribute)."""
    parts = []
    for k in keys:
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return ".".join(parts)


class _QuietOrbax(logging.Filter):
    """Drops two orbax warnings that are expected here: saves without a metric while the best
    checkpoint is tracked, and items skipped when only the metadata tree is read."""

    EXPECTED = ("did not provide metrics", "was found in the checkpoint, but could not be restored")

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(text in record.getMessage() for text in self.EXPECTED)


_QUIET_ORBAX = _QuietOrbax()


def incomplete_steps(directory: str | Path) -> list[int]:
    """Steps of the half-written checkpoints in ``directory``, ascending: the temporary folders
    (``<step>.orbax-checkpoint-tmp-<timestamp>``) that orbax renames to ``<step>`` only once a
    save is complete, so a crash or kill mid-save leaves them behind (found by orbax's own
    ``orbax.checkpoint.path.step.tmp_checkpoints``)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    steps = set()
    for name in ocp.path.step.tmp_checkpoints(directory):
        head = name.split(ocp.path.step.TMP_DIR_SUFFIX)[0]
        if head.isdigit():
            steps.add(int(head))
    return sorted(steps)


def discarded_message(discarded: list[int], resumed_from: int | None) -> str:
    """What a resume says about interrupted saves it found, e.g. ``step 100 was incomplete
    (interrupted save); resumed from step 50`` ("" when ``discarded`` is empty; ``resumed_from``
    None: no complete checkpoint was left, the run starts anew)."""
    if not discarded:
        return ""
    if len(discarded) == 1:
        what = f"step {discarded[0]} was incomplete"
    else:
        what = f"steps {', '.join(map(str, discarded))} were incomplete"
    then = (
        "no complete checkpoint was left: the run started anew"
        if resumed_from is None
        else f"resumed from step {resumed_from}"
    )
    return f"{what} (interrupted save); {then}"


class Checkpointer:
    """Save and restore ``(TrainState, metadata)`` pairs under ``directory``.

    Args:
      directory: where step folders live (created if missing).
      keep: number of most recent checkpoints to keep (0 or None = keep all).
      best_mode: ``max`` or ``min`` to also keep the checkpoint with the best ``metric`` passed
        to ``save`` (checkpoints saved without one compete only as recent ones); None = last
        ``keep`` only.
      async_save: write in a background thread (orbax async checkpointing).
      cleanup_tmp: delete half-written checkpoints left by a crash (only the process that writes
        checkpoints may do this: a reader would delete a save in progress); their steps are
        kept in ``discarded``.

    Attributes:
      discarded: steps whose interrupted save (an orbax temporary folder,
        ``incomplete_steps``) this checkpointer deletes, ascending (orbax starts deleting
        them in the background when it opens, and waits for that before its first save).
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        keep: int | None = 3,
        best_mode: str | None = None,
        async_save: bool = True,
        cleanup_tmp: bool = False,
    ):
        if best_mode not in (None, "max", "min"):
            raise ValueError(f"best_mode must be None, 'max' or 'min', got {best_mode!r}")
        self.directory = Path(directory).absolute()
        self.best_mode = best_mode
        logging.getLogger("absl").addFilter(_QUIET_ORBAX)  # once: addFilter skips a repeat
        # read before orbax deletes them (it does when the manager opens)
        self.discarded = incomplete_steps(self.directory) if cleanup_tmp else []
        policies: list[Any] = [ocm.LatestN(keep or None)]
        if best_mode is not None:
            policies.append(
                ocm.BestN(
                    get_metric_fn=self._metric,
                    reverse=best_mode == "min",
                    n=1,
                    keep_checkpoints_without_metrics=False,
                )
            )
        options = ocp.CheckpointManagerOptions(
            create=True,
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=cleanup_tmp,
            preservation_policy=ocm.AnyPreservationPolicy(policies),
            best_fn=self._metric if best_mode else None,
            best_mode=best_mode or "max",
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def _metric(self, metrics: dict[str, Any]) -> float:
        worst = -math.inf if self.best_mode == "max" else math.inf
        value = metrics.get("value") if isinstance(metrics, dict) else None
        return worst if value is None else float(value)

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self.manager.latest_step()

    def best_step(self) -> int | None:
        """The kept checkpoint with the best metric (None without ``best_mode`` or metrics)."""
        if self.best_mode is None:
            return None
        with_metric = [s for s in self.all_steps() if self.manager.metrics(s) is not None]
        return self.manager.best_step() if with_metric else None

    def all_steps(self) -> list[int]:
        """Steps of all complete checkpoints, ascending."""
        return sorted(self.manager.all_steps())

    def save(
        self, step: int, state: Any, metadata: dict[str, Any], *, metric: float | None = None
    ) -> None:
        """Start saving ``state`` (a pytree of arrays) and JSON ``metadata`` as ``step``.

        Args:
          step: the checkpoint's name (orbax refuses a step that already exists).
          state: pytree of arrays (any sharding).
          metadata: JSON-serialisable bookkeeping, returned by ``restore``.
          metric: the value ranked by ``best_mode`` (e.g. dev BLEU); None = not a candidate.
        """
        items = dict(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(metadata))
        metrics = None if metric is None or self.best_mode is None else {"value": float(metric)}
        self.manager.save(step, args=ocp.args.Composite(**items), metrics=metrics, force=True)

    def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Restore ``(state, metadata)`` of ``step`` (default: latest).

        Arrays come back on ``abstract_state``'s shardings, or on this process's first device
        where it has none, whatever the device count or mesh they were saved from.

        Args:
          abstract_state: a pytree of ``jax.ShapeDtypeStruct`` (or arrays) giving the expected
            structure, shapes, dtypes and (optionally) shardings, e.g. ``jax.eval_shape`` of
            the init.
          step: the checkpoint to restore; None = the latest.

        Raises:
          CheckpointError: no checkpoint exists (or not ``step``), it is damaged, or its
            parameters do not match the model (the message lists missing, unexpected and
            reshaped entries).
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        if step not in self.manager.all_steps():
            raise CheckpointError(
                f"no checkpoint of step {step} in {self.directory}; available: {self.all_steps()}"
            )
        self._check_compatible(abstract_state, step)
        restored = self._read(
            step,
            state=ocp.args.StandardRestore(_placed(abstract_state)),
            meta=ocp.args.JsonRestore(),
        )
        return restored["state"], dict(restored["meta"])

    def metadata(self, step: int) -> dict[str, Any]:
        """The JSON bookkeeping of checkpoint ``step`` without reading its arrays.

        Raises:
          CheckpointError: the checkpoint is incomplete or damaged.
        """
        return dict(self._read(step, meta=ocp.args.JsonRestore())["meta"])

    def _read(self, step: int, **items: Any) -> Any:
        try:
            return self.manager.restore(step, args=ocp.args.Composite(**items))
        except (KeyError, ValueError, OSError) as e:  # a folder without its items or files
            raise CheckpointError(
                f"checkpoint {self.directory / str(step)} cannot be read, it "
                f"is incomplete or damaged ({type(e).__name__}: {e})"
            ) from e

    def _check_compatible(self, abstract_state: Any, step: int) -> None:
        try:
            meta = self.manager.item_metadata(step)["state"]
        except (KeyError, TypeError, ValueError):
            return
        if meta is None:
            return
        want = {
            _path(k): v.shape for k, v in jax.tree_util.tree_flatten_with_path(abstract_state)[0]
        }
        have: dict[str, Any] = {
            _path(k): getattr(v, "shape", None)
            for k, v in jax.tree_util.tree_flatten_with_path(meta)[0]
        }
        # optimizer moments mirror the parameters: report parameters only, shapes first
        keys = [k for k in {**want, **have} if not k.startswith("opt_state.")]
        problems = [
            f"shape {k}: checkpoint {tuple(have[k])} vs model {tuple(want[k])}"
            for k in keys
            if k in have and k in want and have[k] is not None and tuple(have[k]) != tuple(want[k])
        ]
        problems += [f"missing in checkpoint: {k}" for k in keys if k not in have]
        problems += [f"not in model: {k}" for k in keys if k not in want]
        problems = [p.replace(".value", "") for p in problems]
        if problems:
            shown = "\n  ".join(problems[:20])
            more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
            raise CheckpointError(
                f"checkpoint {self.directory / str(step)} does not match the model:\n"
                f"  {shown}{more}"
            )

    def wait(self) -> None:
        """Block until any background save has finished."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        """Finish pending saves and release resources."""
        self.manager.wait_until_finished()
        self.manager.close()
