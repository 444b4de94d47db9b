"""Checkpoints with orbax-checkpoint: train state + JSON bookkeeping, saved atomically.

Layout: ``workdir/checkpoints/<step>/{state,meta}``. Orbax writes each step into a temporary
directory and renames it when complete, so a crash mid-save leaves the previous checkpoint
intact and the half-written one is ignored. No pickle is used: arrays go to tensorstore/zarr,
bookkeeping to JSON.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be restored into the current model; the message lists why."""


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


class Checkpointer:
    """Save and restore ``(TrainState, metadata)`` pairs under ``directory``.

    Args:
      directory: where step folders live (created if missing).
      keep: number of most recent checkpoints to keep.
      async_save: write in a background thread (orbax async checkpointing).
    """

    def __init__(self, directory: str | Path, *, keep: int = 3, async_save: bool = True):
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                               enable_async_checkpointing=async_save)
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        """Steps of all complete checkpoints, ascending."""
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: Any, metadata: dict[str, Any]) -> None:
        """Start saving ``state`` (a pytree of arrays) and JSON ``metadata`` as ``step``."""
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(metadata)), force=True)

    def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Restore ``(state, metadata)`` of ``step`` (default: latest).

        Args:
          abstract_state: a pytree of ``jax.ShapeDtypeStruct`` (or arrays) giving the expected
            structure, shapes, dtypes and shardings (e.g. ``jax.eval_shape`` of the init).

        Raises:
          CheckpointError: no checkpoint exists, or its parameters do not match the model
            (the message lists missing, unexpected and reshaped entries).
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        self._check_compatible(abstract_state, step)
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
        return restored["state"], dict(restored["meta"])

    def _check_compatible(self, abstract_state: Any, step: int) -> None:
        try:
            meta = self.manager.item_metadata(step)["state"]
        except (KeyError, TypeError, ValueError):
            return
        if meta is None:
            return
        want = {_path(k): v.shape for k, v in jax.tree_util.tree_flatten_with_path(abstract_state)[0]}
        have = {_path(k): getattr(v, "shape", None) for k, v in
                jax.tree_util.tree_flatten_with_path(meta)[0]}
        # optimizer moments mirror the parameters: report parameters only, shapes first
        keys = [k for k in {**want, **have} if not k.startswith("opt_state.")]
        problems = [f"shape {k}: checkpoint {tuple(have[k])} vs model {tuple(want[k])}" for k in keys
                    if k in have and k in want and have[k] is not None
                    and tuple(have[k]) != tuple(want[k])]
        problems += [f"missing in checkpoint: {k}" for k in keys if k not in have]
        problems += [f"not in model: {k}" for k in keys if k not in want]
        problems = [p.replace(".value", "") for p in problems]
        if problems:
            shown = "\n  ".join(problems[:20])
            more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
            raise CheckpointError(
                f"checkpoint {self.directory / str(step)} does not match the model:\n  {shown}{more}")

    def wait(self) -> None:
        """Block until any background save has finished."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        """Finish pending saves and release resources."""
        self.manager.wait_until_finished()
        self.manager.close()
