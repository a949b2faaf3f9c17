"""Check chapter 07's find-the-bug exercise: a causal one-program Triton kernel after a KV cache, its ``N_Q``
queries the *last* positions of ``n_k`` (query ``i`` sees key ``j <= i + n_k - N_Q``, bottom-right)."""

from __future__ import annotations

import math

import torch

from attn_course.checks.diagnosis import CheckFailed, call_answer, check_close, triton_missing

__all__ = ["check_causal_kernel", "masked_attention"]


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


def _visible(n_q: int, n_k: int, shift: int, strict: bool = False) -> torch.Tensor:
    """Query i sees key j when j <= i + shift (j < i + shift when ``strict``)."""
    i, j = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
    return (j < i + shift) if strict else (j <= i + shift)


def _mistakes(q, k, v, block):
    (n_q, d), n_k = q.shape, k.shape[0]
    offset = n_k - n_q
    padded = -(-n_k // block) * block                      # keys up to the end of the last tile
    k_zero = torch.cat([k, k.new_zeros(padded - n_k, d)])  # what a masked load with other=0.0 gives
    v_zero = torch.cat([v, v.new_zeros(padded - n_k, d)])
    ways = [
        (f"Your kernel aligns the causal mask top-left (query i sees keys j <= i). After a KV cache the "
         f"{n_q} queries are the LAST positions: query i sits at position i + n_k - N_Q = i + {offset}, "
         "so it sees keys j <= i + n_k - N_Q. The bug only shows when N_Q < n_k.",
         _visible(n_q, n_k, 0)),
        ("Your mask hides the diagonal: a query sees its own position too (j <= i + n_k - N_Q, not <).",
         _visible(n_q, n_k, offset, strict=True)),
        ("Your kernel applies no causal mask: each query saw keys after its own position.",
         torch.ones(n_q, n_k, dtype=torch.bool)),
    ]
    found = [(message, masked_attention(q, k, v, visible).float()) for message, visible in ways]
    if padded > n_k:
        found.append(("The keys past n_k in the last tile count as keys with score 0: a masked load fills "
                      "them with 0.0, and a score of 0 is not a hidden key. Keep the scores of "
                      "cols >= n_k at -inf, as well as the future ones.",
                      masked_attention(q, k_zero, v_zero, _visible(n_q, padded, offset)).float()))
    return found


def check_causal_kernel(kernel: object) -> bool | None:
    """Check a causal one-program Triton attention kernel whose queries come after a KV cache: 16 queries
    against 16, 40 and 64 keys in tiles of 16, on the GPU or in Triton's interpreter, against attention
    under the bottom-right causal mask in float64.

    Returns:
        True; None, after saying so, where Triton is not installed (nothing can be checked there).

    Raises:
        CheckFailed: NaN or inf in the output (a row that sees no key), or the mask it matches
            instead (top-left, the diagonal hidden, no mask, padded keys scored 0), else the
            first entry that differs.
    """
    if triton_missing("check_causal_kernel"):
        return None
    from attn_course.flash.small_kernel import launch_small_attention  # imports Triton

    generator = torch.Generator().manual_seed(7)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for n_k in (16, 40, 64):
        q, k, v = (torch.randn(n, 16, generator=generator) for n in (16, n_k, n_k))
        got, _ = call_answer("check_causal_kernel", launch_small_attention, kernel, q.to(device), k.to(device),
                             v.to(device), described=f"q [16, 16], k and v [{n_k}, 16], BLOCK_N = 16")
        got = got.cpu()
        if torch.isnan(got).any() or torch.isinf(got).any():
            raise CheckFailed(f"With n_k = {n_k} your kernel's output holds NaN or inf: some query saw no key at "
                              "all. Query i (of N_Q) sits at position i + n_k - N_Q and sees every key up to it, "
                              "its own included: is the diagonal hidden (< for <=), or the offset's sign reversed?")
        expected = masked_attention(q, k, v, _visible(16, n_k, n_k - 16)).float()
        check_close(got, expected, what=f"Your kernel's output (n_k = {n_k})", mistakes=_mistakes(q, k, v, 16),
                    hint="write down, for query i, the position it sits at when N_Q < n_k.")
    return True
