"""``seq2seq-train`` whose save of one step hangs after writing part of its temporary
directory, so a test can kill the process mid-save for certain (the crash-safety test of
tests/test_resume.py). Usage: ``python tests/hang_save.py STEP KEY=VALUE ...``.

The hang is an extra orbax item (``HANG_MARKER``, a JSON file) added to that step's save;
its handler writes the file, then sleeps for an hour inside the save.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import orbax.checkpoint as ocp

from seq2seq.cli import train_main
from seq2seq.training.checkpoints import Checkpointer

HANG_MARKER = "hang_marker"


class _HangHandler(ocp.JsonCheckpointHandler):
    """Writes its JSON item (file ``HANG_MARKER``), then sleeps inside the save."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(HANG_MARKER)

    async def _save_fn(self, x: Any, directory: Any) -> None:
        await super()._save_fn(x, directory)
        print(f"hang_save: holding the save of step {x.get('step')} open", file=sys.stderr)
        time.sleep(3600)


@ocp.args.register_with_handler(_HangHandler, for_save=True)
class _HangSave(ocp.args.JsonSave):
    """Save arguments of the hanging item."""


@ocp.args.register_with_handler(_HangHandler, for_restore=True)
class _HangRestore(ocp.args.JsonRestore):
    """Restore arguments of the hanging item (orbax wants both directions registered)."""


def hang_at(step: int) -> None:
    """Make ``Checkpointer.save`` of ``step`` carry the hanging item."""
    save = Checkpointer.save

    def hanging(self: Checkpointer, at: int, *args: Any, **kwargs: Any) -> None:
        if at != step:
            return save(self, at, *args, **kwargs)
        manager_save = self.manager.save

        def with_item(s: int, *, args: Any, **kw: Any) -> Any:
            items = dict(args.items(), test_hang=_HangSave({"step": s}))
            return manager_save(s, args=ocp.args.Composite(**items), **kw)

        self.manager.save = with_item  # type: ignore[method-assign]
        try:
            save(self, at, *args, **kwargs)
        finally:
            self.manager.save = manager_save  # type: ignore[method-assign]

    Checkpointer.save = hanging  # type: ignore[method-assign]


if __name__ == "__main__":
    hang_at(int(sys.argv[1]))
    sys.exit(train_main(sys.argv[2:]))
