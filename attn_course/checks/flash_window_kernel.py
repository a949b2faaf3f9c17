"""Check chapter 07's find-the-bug exercise: a one-program Triton kernel for decoding with a sliding window,
its ``N_Q`` queries the *last* positions of ``n_k`` (query ``i`` at position ``p = i + n_k - N_Q`` sees the
``WINDOW`` keys ``p - WINDOW < j <= p``), whose rows that see no key in a tile must not turn into NaN."""

from __future__ import annotations

import math

import torch

from attn_course.checks.diagnosis import CheckFailed, call_answer, check_close, triton_missing
from attn_course.core.masks import causal_mask
from attn_course.variants.masks import sliding_window_mask

__all__ = ["WINDOW", "check_window_kernel", "masked_attention"]

#: The window of the exercise's kernel: each query sees its own key and the WINDOW - 1 before it.
WINDOW = 24


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """``softmax(q kᵀ / √d) v`` over the ``visible [N_q, N_k]`` pairs only, in float64 (rows with none: NaN).

    Example:
        >>> q, k, v = torch.randn(2, 4), torch.randn(3, 4), torch.randn(3, 4)
        >>> visible = torch.tensor([[True, True, False], [True, True, True]])
        >>> out = masked_attention(q, k, v, visible)
        >>> torch.allclose(out[1], torch.softmax(q[1].double() @ k.double().T / 2, -1) @ v.double())
        True
    """
    scores = q.double() @ k.double().T / math.sqrt(q.shape[-1])                 # [N_q, N_k]
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1) @ v.double()


def _mistakes(q, k, v, block):
    (n_q, d), n_k = q.shape, k.shape[0]
    padded = -(-n_k // block) * block                      # keys up to the end of the last tile
    k_zero = torch.cat([k, k.new_zeros(padded - n_k, d)])  # what a masked load with other=0.0 gives
    v_zero = torch.cat([v, v.new_zeros(padded - n_k, d)])
    ways = [
        (f"Your window is one key too wide: a query at position p sees the {WINDOW} keys p - {WINDOW - 1} .. p, "
         f"its own included, so key j is visible when j > p - {WINDOW} (not >=).",
         sliding_window_mask(n_q, n_k, window=WINDOW + 1)),
        ("Your kernel forgets the window: each query saw every key up to its position, as in plain causal "
         "attention.", causal_mask(n_q, n_k)),
        ("Your kernel places the queries at positions 0 .. N_Q - 1: after n_k - N_Q cached keys, query i sits at "
         "position i + n_k - N_Q, as the classmate's kernel had it.",
         sliding_window_mask(n_q, n_k, window=WINDOW, offset=0)),
    ]
    found = [(message, masked_attention(q, k, v, visible).float()) for message, visible in ways]
    if padded > n_k:
        found.append(("The keys past n_k in the last tile count as keys with score 0: a masked load fills "
                      "them with 0.0, and a score of 0 is not a hidden key. Keep the scores of "
                      "cols >= n_k at -inf, as well as the hidden ones.",
                      masked_attention(q, k_zero, v_zero, sliding_window_mask(n_q, padded, window=WINDOW,
                                                                               offset=n_k - n_q)).float()))
    return found


def check_window_kernel(kernel: object) -> bool | None:
    """Check a one-program Triton attention kernel for decoding with a sliding window of ``WINDOW`` keys: 16
    queries after a cache, against 16, 40 and 64 keys in tiles of 16, on the GPU or in Triton's interpreter,
    against attention under the same mask in float64.

    Returns:
        True; None, after saying so, where Triton is not installed (nothing can be checked there).

    Raises:
        CheckFailed: NaN or inf in the output (the rows named: a tile in which a row sees no key), or
            the mask it matches instead (the window one key too wide, no window, the queries at
            0 .. N_Q - 1, padded keys scored 0), else the first entry that differs.
    """
    if triton_missing("check_window_kernel"):
        return None
    from attn_course.flash.small_kernel import launch_small_attention  # imports Triton

    generator = torch.Generator().manual_seed(7)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for n_k in (16, 40, 64):
        q, k, v = (torch.randn(n, 16, generator=generator) for n in (16, n_k, n_k))
        got, _ = call_answer("check_window_kernel", launch_small_attention, kernel, q.to(device), k.to(device),
                             v.to(device), described=f"q [16, 16], k and v [{n_k}, 16], BLOCK_N = 16")
        got = got.cpu()
        broken = (~torch.isfinite(got)).any(dim=-1).nonzero().flatten().tolist()
        if broken:
            raise CheckFailed(
                f"With n_k = {n_k} your kernel's output holds NaN or inf in rows {broken}: those queries see no key "
                "in the first tile(s) (they lie before the window), so there m_i and the tile's maximum are both "
                "-inf, and exp2(-inf - (-inf)) is NaN. While a row has seen nothing, measure its weights against "
                "0 instead (tl.where), or start each row's loop where its window starts.")
        expected = masked_attention(q, k, v, sliding_window_mask(16, n_k, window=WINDOW)).float()
        check_close(got, expected, what=f"Your kernel's output (n_k = {n_k})", mistakes=_mistakes(q, k, v, 16),
                    hint="write down, for query i, its position and the keys its window holds.")
    return True
