"""Mixed precision: matmuls in the compute dtype, accumulated in float32.

With ``model.dtype: bfloat16`` every projection multiplies bfloat16 operands but sums the
products in float32 and rounds only the result (Micikevicius et al. 2018, "Mixed Precision
Training", §3; what bf16 matrix units do on TPU and GPU). The backward pass does the same: the
incoming gradient is rounded to bfloat16 and both gradient products accumulate in float32,
so each projection runs its forward product and both gradient products at bf16 speed. Asking
XLA for a float32 result is also what selects the fast bf16 kernels on CPUs with AVX512-BF16.

In float32 the same custom VJP computes exactly the products autodiff would (dx = g·Wᵀ,
dW = xᵀ·g), but it flattens the leading axes before the weight gradient: autodiff contracts
``[batch, length, in]`` with ``[batch, length, out]`` over two axes, a form XLA's CPU backend
runs through its slow generic dot plus copies, where a 2-D ``[tokens, in]ᵀ·[tokens, out]``
goes to the fast matmul kernels. The custom VJP is one of the kernels ``seq2seq.kernels``
selects; its ``reference`` choice is ``lax.dot_general`` (float32 accumulation) and autodiff.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from seq2seq import kernels


def _dot(a, b, contract_a: int, contract_b: int):
    return lax.dot_general(
        a, b, (((contract_a,), (contract_b,)), ((), ())), preferred_element_type=jnp.float32
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _matmul(x, w, w_transposed: bool, out_dtype, dtypes):
    operand = dtypes[2]
    x, w = x.astype(operand), w.astype(operand)
    return _dot(x, w, x.ndim - 1, 1 if w_transposed else 0).astype(out_dtype)


def _matmul_fwd(x, w, w_transposed, out_dtype, dtypes):
    out = _matmul(x, w, w_transposed, out_dtype, dtypes)
    return out, (x.astype(dtypes[2]), w.astype(dtypes[2]))  # residuals in the operand dtype


def _materialised_transpose(a):
    """``aᵀ`` of a 2-D array, written out in row-major order.

    XLA would otherwise fold the transpose into the consuming dot as a column-major operand,
    which XLA:CPU's bfloat16 kernels multiply 4–6× slower than a row-major one (a float32
    product runs at the same speed either way). The reshape through ``[rows, 1, cols]`` makes
    the transposed layout a real copy.
    """
    rows, cols = a.shape
    return a.reshape(rows, 1, cols).transpose(2, 0, 1).reshape(cols, rows)


def _matmul_bwd(w_transposed, out_dtype, dtypes, residuals, g):
    x, w = residuals
    x_dtype, w_dtype, operand = dtypes
    g = g.astype(operand)  # the incoming gradient rounded like the operands
    # y = x·W (W [in, out]) or x·Wᵀ (W [out, in]); x [..., in], g [..., out]
    dx = _dot(g, w, g.ndim - 1, 0 if w_transposed else 1).astype(x_dtype)
    x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
    if operand == jnp.float32:  # [out, in] / [in, out], contracted over the tokens
        dw = _dot(g2, x2, 0, 0) if w_transposed else _dot(x2, g2, 0, 0)
    else:  # the same products from a row-major x2ᵀ (and a row-major [out, in] result)
        dw = _dot(_materialised_transpose(x2), g2, 1, 0)  # [in, out]
        dw = _materialised_transpose(dw) if w_transposed else dw
    return dx, dw.astype(w_dtype)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def matmul(
    x: jax.Array,
    w: jax.Array,
    *,
    w_transposed: bool = False,
    out_dtype=None,
    operand_dtype=None,
) -> jax.Array:
    """``x · W`` (or ``x · Wᵀ``) accumulated in float32, forward and backward.

    Args:
      x: ``[..., in]`` in the compute dtype.
      w: ``[in, out]``, or ``[out, in]`` with ``w_transposed`` (a tied embedding table), in
        the compute dtype.
      out_dtype: result dtype; default ``x.dtype`` (float32 for logits).
      operand_dtype: dtype the operands are rounded to before the product (``bfloat16``: the
        ``model.matmul_dtype`` of a float32 model), in the gradient products too; default
        ``x.dtype``.

    Returns:
      ``[..., out]`` in ``out_dtype``. Gradients are in the operands' dtypes.
    """
    out_dtype = jnp.dtype(out_dtype or x.dtype)
    operand = jnp.dtype(operand_dtype or x.dtype)
    if kernels.cpu():
        return _matmul(x, w, w_transposed, out_dtype, (x.dtype, w.dtype, operand))
    xo, wo = x.astype(operand), w.astype(operand)  # autodiff
    return _dot(xo, wo, x.ndim - 1, 1 if w_transposed else 0).astype(out_dtype)


def dot_general_f32_accumulate(
    lhs: jax.Array,
    rhs: jax.Array,
    dimension_numbers,
    precision=None,
    preferred_element_type=None,
    out_sharding=None,
    operand_dtype=None,
    **kwargs,
) -> jax.Array:
    """A ``dot_general`` for ``nnx.Linear``: ``matmul`` for its ``x[..., in] · W[in, out]``.

    Args:
      lhs: ``[..., in]`` activations in the compute dtype (float32 or bfloat16).
      rhs: ``[in, out]`` kernel in the compute dtype.
      dimension_numbers, precision: as ``lax.dot_general``.
      preferred_element_type: ignored (float32 accumulation is the point).
      out_sharding: passed on when set; ``nnx.Linear`` passes None.
      operand_dtype: as ``matmul`` (bind it with ``linear_dot_general``).

    Returns:
      ``[..., out]`` in ``lhs.dtype``. Any other contraction, a ``precision`` or an
      ``out_sharding`` falls back to ``lax.dot_general`` accumulated in float32 (forward only).
    """
    del preferred_element_type
    dtype = lhs.dtype
    linear = ((lhs.ndim - 1,), (0,))
    if (
        out_sharding is None
        and not kwargs
        and precision is None
        and rhs.ndim == 2
        and tuple(map(tuple, dimension_numbers[0])) == linear
        and not any(dimension_numbers[1])
    ):
        return matmul(lhs, rhs, operand_dtype=operand_dtype)
    if operand_dtype is not None:
        lhs, rhs = lhs.astype(operand_dtype), rhs.astype(operand_dtype)
    if out_sharding is not None:
        kwargs["out_sharding"] = out_sharding
    out = lax.dot_general(
        lhs,
        rhs,
        dimension_numbers,
        precision=precision,
        preferred_element_type=jnp.float32,
        **kwargs,
    )
    return out.astype(dtype)


def operand_dtype(matmul_dtype: str | None) -> jnp.dtype | None:
    """The ``operand_dtype`` of ``matmul`` for a ``model.matmul_dtype``: None (operands as they
    are in the compute dtype) for ``float32`` or None, else that dtype."""
    return None if matmul_dtype in (None, "float32") else jnp.dtype(matmul_dtype)


def linear_dot_general(matmul_dtype: str | None = None) -> Callable[..., jax.Array]:
    """``nnx.Linear``'s ``dot_general``: float32 accumulation, operands in ``matmul_dtype``
    (``None`` or ``float32``: as they come in the compute dtype)."""
    operand = operand_dtype(matmul_dtype)
    if operand is None:
        return dot_general_f32_accumulate
    return functools.partial(dot_general_f32_accumulate, operand_dtype=operand)
