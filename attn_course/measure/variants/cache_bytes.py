"""What each variant keeps per sequence to decode the next token, in bytes, for one stated configuration."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from attn_course import _validate
from attn_course.measure.rows import check_rows
from attn_course.variants.kv_cache_size import (
    gqa_cache_elements,
    mha_cache_elements,
    mla_cache_elements,
    mqa_cache_elements,
)

__all__ = ["CacheBytesRow", "cache_bytes_rows", "print_cache_bytes"]


@dataclasses.dataclass(frozen=True)
class CacheBytesRow:
    """What one variant keeps per sequence to decode, from :func:`cache_bytes_rows` (one layer).

    Attributes:
        variant: ``"MHA"``, ``"GQA"``, ``"MQA"``, ``"MLA"``, ``"sliding window (MHA)"`` or ``"linear"``.
        elements_per_token: elements added per token (for the window, until it is full; 0 for linear).
        bytes_per_token: ``elements_per_token · bytes_per_element``.
        n: the sequence length of ``bytes_at_n``.
        bytes_at_n: bytes held for one sequence of ``n`` tokens.
        fixed: True when ``bytes_at_n`` stops growing with ``n`` (the window, linear attention).
        formula: how ``bytes_at_n`` is counted.
    """

    variant: str
    elements_per_token: int
    bytes_per_token: int
    n: int
    bytes_at_n: int
    fixed: bool
    formula: str



def cache_bytes_rows(
    n: int = 32768,
    *,
    heads: int = 8,
    head_dim: int = 64,
    kv_heads: int = 2,
    kv_lora_rank: int = 256,
    qk_rope_head_dim: int = 32,
    window: int = 4096,
    bytes_per_element: int = 2,
) -> list[CacheBytesRow]:
    """Bytes one layer keeps per sequence to decode, for each variant, in one small configuration.

    MHA, GQA, MQA and MLA per token from :mod:`attn_course.variants.kv_cache_size`; the sliding window
    keeps the last ``W - 1`` tokens of MHA keys and values (a
    :class:`~attn_course.variants.sliding_window.RollingKVCache`), and linear attention a state ``S [d, d]``
    and ``z [d]`` per head, whatever ``n``.

    Args:
        n: tokens in the sequence.
        heads, head_dim: ``n_h`` and ``d_h``.
        kv_heads: ``n_kv`` for GQA (between 1 and ``heads``).
        kv_lora_rank, qk_rope_head_dim: MLA's ``d_c`` and ``d_h^R``.
        window: ``W`` of the sliding window.
        bytes_per_element: 2 for float16/bfloat16, 4 for float32.

    Returns:
        One :class:`CacheBytesRow` per variant: MHA, GQA, MQA, MLA, sliding window (MHA), linear.

    Raises:
        TypeError: a size that is not an int.
        ValueError: a size below 1, or ``kv_heads`` above ``heads``.

    Example:
        >>> rows = cache_bytes_rows(1000, heads=4, head_dim=8, kv_heads=2, kv_lora_rank=16,
        ...                         qk_rope_head_dim=4, window=10, bytes_per_element=2)
        >>> [(row.variant, row.bytes_at_n) for row in rows]
        [('MHA', 128000), ('GQA', 64000), ('MQA', 32000), ('MLA', 40000),
         ('sliding window (MHA)', 1152), ('linear', 576)]
    """
    where = "cache_bytes_rows"
    n = _validate.integer(where, "n", n, minimum=1)
    heads = _validate.integer(where, "heads", heads, minimum=1)
    head_dim = _validate.integer(where, "head_dim", head_dim, minimum=1)
    kv_heads = _validate.integer(where, "kv_heads", kv_heads, minimum=1)
    if kv_heads > heads:
        raise ValueError(f"{where}: kv_heads must be at most heads, got kv_heads={kv_heads}, heads={heads}")
    window = _validate.integer(where, "window", window, minimum=1)
    size = _validate.integer(where, "bytes_per_element", bytes_per_element, minimum=1)
    mha = mha_cache_elements(heads, head_dim)
    held = min(n, window - 1)
    linear_state = heads * (head_dim * head_dim + head_dim)
    growing = [("MHA", mha, "2·n_h·d_h·n"), ("GQA", gqa_cache_elements(kv_heads, head_dim), "2·n_kv·d_h·n"),
               ("MQA", mqa_cache_elements(head_dim), "2·d_h·n"),
               ("MLA", mla_cache_elements(kv_lora_rank, qk_rope_head_dim), "(d_c + d_h^R)·n")]
    rows = [CacheBytesRow(variant=name, elements_per_token=elements, bytes_per_token=elements * size, n=n,
                          bytes_at_n=elements * size * n, fixed=False, formula=f"{formula} · bytes")
            for name, elements, formula in growing]
    rows.append(CacheBytesRow(variant="sliding window (MHA)", elements_per_token=mha, bytes_per_token=mha * size,
                              n=n, bytes_at_n=mha * size * held, fixed=n >= window - 1,
                              formula="2·n_h·d_h·min(n, W-1) · bytes"))
    rows.append(CacheBytesRow(variant="linear", elements_per_token=0, bytes_per_token=0, n=n,
                              bytes_at_n=linear_state * size, fixed=True, formula="n_h·(d_h·d_h + d_h) · bytes"))
    return rows


def print_cache_bytes(rows: Sequence[CacheBytesRow]) -> None:
    """Print the rows of :func:`cache_bytes_rows` as a table.

    Args:
        rows: a non-empty sequence of :class:`CacheBytesRow`.

    Raises:
        TypeError: ``rows`` not a sequence of :class:`CacheBytesRow`.
        ValueError: no rows.
    """
    rows = check_rows("print_cache_bytes", rows, (CacheBytesRow,))
    print(f"{'variant':>22} {'bytes/token':>12} {'N':>7} {'MiB at N':>9} {'fixed':>6}   formula")
    for r in rows:
        print(f"{r.variant:>22} {r.bytes_per_token:>12} {r.n:>7} {r.bytes_at_n / 2**20:>9.3f} "
              f"{'yes' if r.fixed else 'no':>6}   {r.formula}")
