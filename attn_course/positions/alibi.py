"""ALiBi: attention with linear biases instead of position embeddings (Press, Smith and Lewis, 2021).

    score(i, j) = q_i · k_j / sqrt(d)  -  m_h · (i - j)        for keys j <= i

No position is added to the tokens. Each head ``h`` instead subtracts from every score a
penalty growing linearly with the distance back to the key, at its own rate ``m_h``: heads
with a large slope look only at the last few tokens, heads with a small one far back. Because
the bias depends only on the distance, a model trained on short windows meets nothing new on
longer ones, which is what lets ALiBi models "train short, test long" (the paper's title).

The slopes are a geometric sequence: for ``H`` heads a power of two, ``m_h = 2^(-8h/H)``,
``h = 1 … H`` (1/2, 1/4, …, 1/256 for 8 heads). For other ``H`` the paper takes the
sequence of the power of two just below, ``2^⌊log₂ H⌋``, and fills the remaining heads with
every other slope of the next power of two, which is what BLOOM does too.
"""

from __future__ import annotations

import math

import torch

from attn_course import _validate

__all__ = ["alibi_slopes", "alibi_bias"]


def _geometric_slopes(heads: int) -> list[float]:
    """``2^(-8h/heads)`` for ``h = 1 … heads`` (``heads`` a power of two)."""
    ratio = 2.0 ** (-8.0 / heads)
    return [ratio ** h for h in range(1, heads + 1)]


def alibi_slopes(num_heads: int, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """The per-head slopes ``m_h`` of ALiBi, for any number of heads.

    Args:
        num_heads: ``H >= 1``.
        dtype, device: of the result.

    Returns:
        ``[H]``, decreasing from ``2^(-8/P)`` (``P = 2^⌊log₂ H⌋``): the heads of the largest
        power of two ``P <= H`` get ``2^(-8h/P)``, the others ``2^(-4(2h-1)/P)`` for
        ``h = 1 … H - P``, the odd-numbered slopes of ``2P`` heads.

    Raises:
        TypeError, ValueError: ``num_heads`` not an int ``>= 1``.

    Example:
        >>> alibi_slopes(8)
        tensor([0.5000, 0.2500, 0.1250, 0.0625, 0.0312, 0.0156, 0.0078, 0.0039])
        >>> alibi_slopes(6)            # 4 heads' slopes, then 2 of 8 heads' (the 1st and 3rd)
        tensor([0.2500, 0.0625, 0.0156, 0.0039, 0.5000, 0.1250])
    """
    num_heads = _validate.integer("alibi_slopes", "num_heads", num_heads, minimum=1)
    power_of_two = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = _geometric_slopes(power_of_two)
    slopes += _geometric_slopes(2 * power_of_two)[0::2][: num_heads - power_of_two]
    return torch.tensor(slopes, dtype=dtype, device=device)


def alibi_bias(num_heads: int, n_q: int, n_k: int | None = None, *, offset: int | None = None,
               slopes: torch.Tensor | None = None, dtype: torch.dtype = torch.float32,
               device: torch.device | str | None = None) -> torch.Tensor:
    """The additive ALiBi bias ``-m_h · (i - j)`` for every head, query and key.

    Query ``i`` sits at position ``offset + i`` (default ``N_k - N_q``: the queries are the
    last positions, as after a KV cache), key ``j`` at ``j``. Future keys (``j > i``) get a bias
    of the same formula (positive); combine with a causal mask to hide them, as ALiBi's
    decoders do.

    Args:
        num_heads: ``H``.
        n_q, n_k: numbers of queries and keys (``n_k`` defaults to ``n_q``).
        offset: position of the first query.
        slopes: ``[H]`` slopes; default :func:`alibi_slopes` ``(H)``.
        dtype, device: of the result.

    Returns:
        ``[H, N_q, N_k]``, to add to the scaled scores (``[B, H, N_q, N_k]`` broadcasts).

    Raises:
        TypeError, ValueError: sizes that are not ints ``>= 1``, an int ``offset`` < 0, or
            ``slopes`` that are not a floating ``[H]`` tensor.

    Example:
        >>> alibi_bias(1, 3, slopes=torch.tensor([0.5]))
        tensor([[[ 0.0000,  0.5000,  1.0000],
                 [-0.5000,  0.0000,  0.5000],
                 [-1.0000, -0.5000,  0.0000]]])
    """
    where = "alibi_bias"
    num_heads = _validate.integer(where, "num_heads", num_heads, minimum=1)
    n_q = _validate.integer(where, "n_q", n_q, minimum=1)
    n_k = n_q if n_k is None else _validate.integer(where, "n_k", n_k, minimum=1)
    offset = n_k - n_q if offset is None else _validate.integer(where, "offset", offset, minimum=0)
    if slopes is None:
        slopes = alibi_slopes(num_heads, dtype=dtype, device=device)
    else:
        slopes = _validate.tensor(where, "slopes", slopes)
        if not slopes.is_floating_point() or slopes.shape != (num_heads,):
            raise ValueError(f"{where}: slopes must be a floating [H] = [{num_heads}] tensor, got "
                             f"{_validate.shape_str(slopes)} {slopes.dtype}")
        slopes = slopes.to(dtype=dtype, device=device)
    query_position = torch.arange(n_q, device=device, dtype=dtype)[:, None] + offset     # [N_q, 1]
    key_position = torch.arange(n_k, device=device, dtype=dtype)[None, :]                # [1, N_k]
    # -m · (i - j) written as m · (j - i): the same number, without a "-0." on the diagonal.
    return slopes[:, None, None] * (key_position - query_position)                        # [H, N_q, N_k]
