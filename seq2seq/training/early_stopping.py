"""Best-checkpoint selection and early stopping, as JSON that travels in each checkpoint.

The tracker is stored in every checkpoint's metadata, so a resumed run knows the best value so
far, its step and how many evaluations have passed without improvement: patience survives
preemption and restarts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

# dev metrics a run can select its best checkpoint by, and which direction is better
MODES = {"bleu": "max", "chrf": "max", "loss": "min"}


@dataclass
class BestTracker:
    """The best value of one dev metric and the evaluations since it last improved.

    An evaluation improves when ``metric`` is strictly better, or, for ``bleu`` and ``chrf``,
    equal with a strictly lower dev loss: early in training (and on tiny dev subsets) BLEU is
    often flat at 0, and the checkpoint with the lower loss is then the better one.

    Attributes:
      metric: ``bleu`` or ``chrf`` (sacreBLEU's, higher is better) or ``loss`` (lower is
        better).
      value: the best value so far (None before the first evaluation).
      step: the step where it was reached.
      loss: the dev loss at that step (the tie-breaker for ``bleu`` and ``chrf``), if given.
      evals_without_improvement: evaluations in a row that did not improve.

    Raises:
      ValueError: ``metric`` is not one of ``MODES``.
    """

    metric: str
    value: float | None = None
    step: int | None = None
    loss: float | None = None
    evals_without_improvement: int = 0

    def __post_init__(self):
        if self.metric not in MODES:
            raise ValueError(f"unknown best metric {self.metric!r}; use one of {sorted(MODES)}")

    @property
    def mode(self) -> str:
        """``max`` or ``min``: which direction is better."""
        return MODES[self.metric]

    def update(self, value: float, step: int, loss: float | None = None) -> bool:
        """Record an evaluation of ``metric`` (and the dev ``loss``); returns True if it improves.

        A non-finite value never improves.
        """
        if not math.isfinite(value):
            better = False
        elif self.value is None:
            better = True
        elif self.mode == "max":
            tie_won = (
                value == self.value
                and loss is not None
                and self.loss is not None
                and loss < self.loss
            )
            better = value > self.value or tie_won
        else:
            better = value < self.value
        if better:
            self.value, self.step, self.evals_without_improvement = float(value), int(step), 0
            self.loss = None if loss is None else float(loss)
        else:
            self.evals_without_improvement += 1
        return better

    def should_stop(self, patience: int) -> bool:
        """True when ``patience`` > 0 evaluations in a row brought no improvement."""
        return patience > 0 and self.evals_without_improvement >= patience

    def to_json(self) -> dict[str, Any]:
        """A plain dict for the checkpoint's JSON metadata."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None, metric: str) -> BestTracker:
        """The tracker saved in a checkpoint, or a fresh one if none was saved or it tracked a
        different metric (e.g. ``train.best_metric`` changed between runs)."""
        if not data or data.get("metric") != metric:
            return cls(metric)
        return cls(
            metric=metric,
            value=data.get("value"),
            step=data.get("step"),
            loss=data.get("loss"),
            evals_without_improvement=int(data.get("evals_without_improvement", 0)),
        )
