"""One switch between the XLA:CPU-tuned kernels and the plain reference ones.

Three hot spots have two implementations that compute the same thing; ``tests/test_kernels.py``
checks that they agree (outputs and gradients within float32 tolerance, beam search tokens
identical):

* ``model/precision.py`` ``matmul``: ``cpu`` is a custom VJP whose weight gradient is one 2-D
  ``[tokens, in]ᵀ·[tokens, out]`` product; ``reference`` is ``lax.dot_general`` and autodiff.
* ``model/attention.py`` ``cached_attention`` with several queries per row (the beams of a
  sentence): ``cpu`` writes both products as a broadcast multiply and a float32 sum;
  ``reference`` uses ``einsum``.
* ``decoding.py``, the top-k tokens of every beam: ``cpu`` is ``top_k_by_chunks``;
  ``reference`` is ``jax.lax.top_k``.

Why the ``cpu`` kernels exist: XLA's CPU backend runs a contraction over two axes (autodiff's
weight gradient), and batched products of many tiny matrices (beams × heads at one decoding
step), through slow generic loops, and its ``top_k`` over a whole vocabulary is slow; the
README's "How it works" and benchmark sections give the measurements. They were never
measured elsewhere, so the default follows the backend: the ``cpu`` kernels on JAX's CPU
backend, the ``reference`` ones on GPU and TPU (``for_backend``), chosen when first needed
(at the first trace) and logged.

Usage::

    from seq2seq import kernels
    with kernels.use("reference"):   # for a block
        ...
    kernels.select("reference")      # for the rest of the process

or ``SEQ2SEQ_KERNELS=cpu|reference`` in the environment (read once, at import; for the
command-line tools), which overrides the backend's default. The choice is read when a
function is traced. Changing it clears JAX's compilation caches (``jax.clear_caches``), so
nothing compiled under the other choice is reused.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import jax

log = logging.getLogger(__name__)

CPU = "cpu"
REFERENCE = "reference"
CHOICES = (CPU, REFERENCE)


def _check(name: str) -> str:
    if name not in CHOICES:
        raise ValueError(f"unknown kernels {name!r}; choose {' or '.join(CHOICES)}")
    return name


_ENVIRONMENT = os.environ.get("SEQ2SEQ_KERNELS") or None
# None until first needed: then the backend's default (for_backend)
_selected: str | None = _check(_ENVIRONMENT) if _ENVIRONMENT else None


def for_backend(backend: str) -> str:
    """The default kernels on JAX backend ``backend`` (``jax.default_backend()``): ``"cpu"``
    on ``cpu``, ``"reference"`` on any other (``gpu``, ``cuda``, ``rocm``, ``tpu``)."""
    return CPU if backend == "cpu" else REFERENCE


def selected() -> str:
    """The kernels in use: ``"cpu"`` or ``"reference"`` (on first call without a choice made,
    the default of ``jax.default_backend()``, logged)."""
    global _selected
    if _selected is None:
        backend = jax.default_backend()
        _selected = for_backend(backend)
        log.info(
            "kernels: %s (the default on the JAX %s backend; SEQ2SEQ_KERNELS=cpu|reference "
            "chooses)",
            _selected,
            backend,
        )
    return _selected


def cpu() -> bool:
    """True when the XLA:CPU-tuned kernels are selected (the default on the CPU backend)."""
    return selected() == CPU


def select(name: str) -> None:
    """Use kernels ``name`` (``"cpu"`` or ``"reference"``) from now on.

    Raises:
      ValueError: unknown name.
    """
    global _selected
    if _check(name) != _selected:
        _selected = name
        jax.clear_caches()  # compiled functions traced the other kernels


@contextlib.contextmanager
def use(name: str) -> Iterator[None]:
    """``select(name)`` for the ``with`` block, then the previous choice again."""
    previous = selected()
    select(name)
    try:
        yield
    finally:
        select(previous)
