"""Check chapter 07's Triton exercise, a kernel (:mod:`attn_course.flash.small_kernel`'s frame) whose online
softmax rescales only when it must, one decision per tile (FlashAttention-4's rule): its output against
SDPA, the maxima it ends with against the rule, simulated in float64 by :func:`lazy_rescaling`."""

from __future__ import annotations

import ast
import inspect
import math
import textwrap

import torch
import torch.nn.functional as F

from attn_course.checks.diagnosis import CheckFailed, call_answer, check_close, triton_missing

__all__ = ["check_rescale_kernel", "lazy_rescaling"]

LOG2_E = 1.4426950408889634
#: The threshold of the exercise, in base 2: the maximum is raised when a tile's exceeds it by more.
TAU = 8.0


def lazy_rescaling(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int, tau: float, *,
                   per_tile: bool = True, rescale_acc: bool = True, rescale_sum: bool = True,
                   natural_exp: bool = False, p_from_tile_max: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The exercise's loop over tiles of ``block`` keys in float64: ``(out [N_q, d_v], row_max [N_q])``, the
    maxima in base 2. With ``per_tile`` (the exercise's rule) one decision per tile: when some row's tile
    maximum exceeds its running maximum by more than ``tau``, every row's maximum is raised to the largest
    score it has seen, else none is; without it each row decides alone (0: whenever larger). The other
    keywords do one step wrong (the mistakes; ``p_from_tile_max``: weights against the tile's own maximum).

    Example:
        >>> q, k, v = torch.randn(4, 8), torch.randn(20, 8), torch.randn(20, 8)
        >>> out, _ = lazy_rescaling(q, k, v, 8, 8.0)
        >>> torch.allclose(out, F.scaled_dot_product_attention(q.double(), k.double(), v.double()))
        True
    """
    q, k, v = q.double(), k.double(), v.double()
    exp = torch.exp if natural_exp else torch.exp2
    row_max = torch.full(q.shape[:1], float("-inf"), dtype=torch.float64)
    row_sum = torch.zeros(q.shape[:1], dtype=torch.float64)
    acc = torch.zeros(q.shape[0], v.shape[1], dtype=torch.float64)
    for start in range(0, k.shape[0], block):
        scores = q @ k[start:start + block].T / math.sqrt(q.shape[1]) * LOG2_E          # [N_q, block], base 2
        tile_max = scores.amax(dim=1)
        if per_tile:
            new_max = torch.maximum(row_max, tile_max) if (tile_max > row_max + tau).any() else row_max
        else:
            new_max = torch.where(tile_max > row_max + tau, tile_max, row_max)
        correction = exp(row_max - new_max)
        weights = exp(scores - (tile_max if p_from_tile_max else new_max)[:, None])
        row_sum = (row_sum * correction if rescale_sum else row_sum) + weights.sum(dim=1)
        acc = (acc * correction[:, None] if rescale_acc else acc) + weights @ v[start:start + block]
        row_max = new_max
    return acc / row_sum[:, None], row_max


def _mistakes(q, k, v, block):
    ways = [
        ("When the maximum is raised, what was accumulated so far was weighted against the old maximum: "
         "rescale acc by the correction too.", dict(rescale_acc=False)),
        ("The running sum must be rescaled by the correction, like acc: l_i = l_i · alpha + rowsum(p).",
         dict(rescale_sum=False)),
        ("The scores are in base 2 (multiplied by log2(e) = 1.4427): use tl.exp2, not tl.exp, so that "
         "exp2(s · log2 e) = e^s.", dict(natural_exp=True)),
        ("Your weights are measured against the tile's own maximum, but l_i and acc hold terms measured "
         "against m_i: compute p = exp2(s - m_new) with the maximum you keep.", dict(p_from_tile_max=True)),
    ]
    return [(message, lazy_rescaling(q, k, v, block, TAU, **options)[0].float()) for message, options in ways]


def _cases(generator: torch.Generator):
    """(q, k, v) whose key tiles raise each row's maximum by less than TAU in some tiles, by more in others."""
    for n_q, n_k, d, growth in ((16, 64, 16, (1.0, 1.6, 4.0, 5.0)), (16, 16, 16, (1.0,)),
                                (16, 32, 16, (1.0, 1.3)), (32, 70, 16, (1.0, 3.5, 1.2, 6.0, 6.5))):
        q, k, v = (torch.randn(n, d, generator=generator) for n in (n_q, n_k, n_k))
        for tile, factor in enumerate(growth):
            k[16 * tile:16 * tile + 16] *= factor                  # later tiles hold larger scores
        yield q, k, v


def check_rescale_kernel(kernel: object) -> bool | None:
    """Check a one-program Triton attention kernel with conditional rescaling (threshold 8, base 2, one decision
    per tile, taken in an ``if``), on the GPU or in Triton's interpreter: 16 queries against 64 keys in tiles
    of 16 whose scores grow, against 16 keys, against 32 keys whose second tile raises no maximum by more than
    the threshold, and 32 queries against 70 keys. Its output must match SDPA, its final maxima the rule's.

    Returns:
        True; None, after saying so, where Triton is not installed (nothing can be checked there).

    Raises:
        CheckFailed: the kernel crashes or returns NaN (a step left out), or names the mistake
            (``tl.exp`` instead of ``tl.exp2``, ``acc`` or ``l_i`` not rescaled, weights measured
            against the tile's maximum, the maximum raised at every tile or row by row, no branch that
            skips the rescaling, ``tl.dot`` in TF32 on a GPU), else the first entry that differs.
    """
    if triton_missing("check_rescale_kernel"):
        return None
    from attn_course.flash.small_kernel import launch_small_attention  # imports Triton

    generator = torch.Generator().manual_seed(64)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for q, k, v in _cases(generator):
        (n_q, d), n_k = q.shape, k.shape[0]
        result = call_answer("check_rescale_kernel", launch_small_attention, kernel, q.to(device), k.to(device),
                             v.to(device), described=f"q [{n_q}, {d}], k and v [{n_k}, {d}], BLOCK_N = 16, tau = 8")
        got, got_max = (t.cpu() for t in result)
        if torch.isnan(got).any() or torch.isinf(got).any():
            raise CheckFailed("Your kernel's output holds NaN or inf: a step of the update is missing (each of m_i, "
                              "l_i and acc must be updated in each tile), or a correction computes -inf - (-inf).")
        expected = F.scaled_dot_product_attention(q, k, v)
        off = (got - expected).abs().max().item()
        if device == "cuda" and 1e-4 < off < 2e-2:
            raise CheckFailed(f"Your kernel's output is off by {off:.1e}: on a GPU a float32 tl.dot runs in TF32 "
                              "(10 bits of mantissa) unless told otherwise; write "
                              "tl.dot(p, v, input_precision=\"ieee\").")
        check_close(got, expected, what="Your kernel's output", mistakes=_mistakes(q, k, v, 16),
                    hint="compare each line of your update with the rule of the statement, in base 2.")
        rule_max = lazy_rescaling(q, k, v, 16, TAU)[1].float()
        always_max = lazy_rescaling(q, k, v, 16, 0.0, per_tile=False)[1].float()
        row_by_row = lazy_rescaling(q, k, v, 16, TAU, per_tile=False)[1].float()
        check_close(got_max, rule_max, what="The maximum m_i your kernel ended with", rtol=1e-5, atol=1e-4, mistakes=[
            ("Your output is right, but your kernel raised m_i whenever a tile's maximum was larger, as the "
             "chapter's kernel does: keep m_i unless some row's tile maximum exceeds it by more than tau.",
             always_max),
            ("Your output is right, but each row decided alone (tl.where row by row): then the tile is still "
             "multiplied by alpha in every row, 1 where nothing changed. Take one decision for the whole tile "
             "(is any row's tile maximum above m_i + tau?), and only then raise every row's maximum and "
             "rescale l_i and acc.", row_by_row),
        ], hint="if any row's tile maximum exceeds m_i + tau: m_i = max(m_i, tile maximum) for every row.")
    if not _branches_in_loop(kernel):
        raise CheckFailed("Your kernel keeps the right maxima, but its loop has no `if`: it still multiplies l_i "
                          "and acc by alpha in every tile. Put the rescaling under `if <one condition for the "
                          "tile>:` so that a tile which needs none skips it.")
    return True


def _branches_in_loop(kernel: object) -> bool:
    """Whether the kernel's source has an ``if`` statement inside its ``for`` loop (True when it cannot be read):
    a Triton kernel's ``fn`` is the function it wraps; the grader's stand-in has none, but its ``source``."""
    try:
        fn = getattr(kernel, "fn", None)
        source = inspect.getsource(fn) if fn is not None else getattr(kernel, "source", None)
        tree = ast.parse(textwrap.dedent(source))
    except (TypeError, OSError, SyntaxError):
        return True
    return any(isinstance(node, ast.If) for loop in ast.walk(tree) if isinstance(loop, ast.For)
               for node in ast.walk(loop))
