"""Check chapter 13's exercises on attention that stops reading every key: the gated delta rule's recurrence (a
state that corrects what a key recalls), and the causal top-k choice of DeepSeek-V3.2's indexer, each against a
reference written out here (the memory prediction: :mod:`attn_course.checks.recurrent_memory`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from attn_course import _validate
from attn_course.checks.diagnosis import CheckFailed, call_answer, check_shape, diagnose, returned_tensors
from attn_course.checks.forbidden import forbid

__all__ = ["check_gated_delta_recurrence", "check_causal_top_k", "delta_rule_reference", "causal_top_k_reference"]


# --- 1. the gated delta rule, token by token -------------------------------------------------------------------

ADDS_EVERYTHING = ("You add every token to the state, S ← αS + β k vᵀ, as decayed linear attention does. The delta "
                   "rule writes only the correction: read what k recalls from the decayed state, αSᵀk, and write "
                   "β k (v − αSᵀk)ᵀ, so that a key seen again replaces its value instead of piling a second on it.")
STALE_RECALL = ("You correct against the state before its decay, β (v − Sᵀk) with the old S. Decay first, then read "
                "what the key recalls from αS: the correction is β (v − αSᵀk), measured on the state it is added to.")
DECAY_AFTER = ("You decay after writing, S ← α(S + β k (v − Sᵀk)ᵀ), which shrinks the token's own write too. The "
               "decay applies to the old state only: S ← αS + β k (v − αSᵀk)ᵀ.")
NO_DECAY = "You never decay the state: multiply it by α_t = exp(g_t) before reading it, at every token."
DECAY_NOT_EXP = ("You decay by g itself: g is the log of the decay (at most 0), so the state is multiplied by "
                 "α = exp(g), a number between 0 and 1.")
NO_BETA = "You write the whole correction: scale it by the token's writing strength β_t, β_t k (v − αSᵀk)ᵀ."
STATE_ORIENTATION = ("You use the state the other way round. The course keeps it [d_k, d_v], keys along the rows, as "
                     "the initial state you are given: a key recalls Sᵀk (sum over the rows), a token writes "
                     "k (v − αSᵀk)ᵀ, a query reads Sᵀq. (Papers write Sk and (v − Sk)kᵀ for the transpose, "
                     "[d_v, d_k].)")
READ_BEFORE_WRITE = ("Your outputs read the state before the token's own write: o_t = scale · S_tᵀ q_t reads the "
                     "state after token t is written, so a token sees its own value, as causal attention sees its "
                     "own key.")
NO_SCALE = "Your outputs are not scaled: o_t = scale · S_tᵀ q_t, with the scale you are given."
DEFAULT_SCALE = "You scale by 1/√d_k: use the scale you are given (a model may choose another)."
STATE_TRANSPOSED = ("Your outputs are right, but the state you return is transposed: return it as it came, "
                    "[B, H, d_k, d_v].")
STATE_NOT_UPDATED = "Your outputs are right, but you return the initial state: return the state after the last token."

_WRITE_THE_RECURRENCE = "the exercise is to write the recurrence yourself, token by token"
#: What the delta-rule exercise may not call: the course's gated delta rule, its cores, or the layer that holds it.
DELTA_RULES = forbid(_WRITE_THE_RECURRENCE, "attn_course.variants.delta_rule.gated_delta_rule",
                     "attn_course.variants.delta_rule._recurrent", "attn_course.variants.delta_rule._chunked",
                     "attn_course.variants.gated_deltanet.GatedDeltaNet")


def delta_rule_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                         state: torch.Tensor, scale: float, *, plant: str | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [B, H, N, d_v], state [B, H, d_k, d_v])`` of the gated delta rule in float64, written in the papers'
    orientation (``S`` is ``[d_v, d_k]`` here), or with one mistake planted (``plant``)."""
    q, k, v, g, beta = (t.double() for t in (q, k, v, g, beta))
    s = state.double() if plant == "transposed" else state.double().transpose(-1, -2)   # [B, H, d_v, d_k]
    scale = {"no_scale": 1.0, "default_scale": 1 / math.sqrt(q.shape[-1])}.get(plant, scale)
    outputs = []
    for t in range(q.shape[2]):
        q_t, k_t, v_t = q[:, :, t, :, None], k[:, :, t, :, None], v[:, :, t, :, None]      # [B, H, d, 1]
        alpha = {"no_decay": torch.ones_like(g[:, :, t]), "not_exp": g[:, :, t]}.get(plant, g[:, :, t].exp())
        alpha, b = alpha[..., None, None], beta[:, :, t, None, None]                         # [B, H, 1, 1]
        before = s
        decayed = alpha * s
        read = decayed.transpose(-1, -2) if plant == "read_transposed" else decayed
        recalled = (s if plant == "stale_recall" else read) @ k_t                            # [B, H, d_v, 1]
        if plant in ("adds", "adds_no_beta"):
            s = decayed + (1.0 if plant == "adds_no_beta" else b) * v_t @ k_t.transpose(-1, -2)
        elif plant == "decay_after":
            s = alpha * (s + b * (v_t - s @ k_t) @ k_t.transpose(-1, -2))
        else:
            s = decayed + (1.0 if plant == "no_beta" else b) * (v_t - recalled) @ k_t.transpose(-1, -2)
        reader = before if plant == "read_before" else s
        reader = reader.transpose(-1, -2) if plant == "out_transposed" else reader
        outputs.append(scale * (reader @ q_t)[..., 0])                                       # [B, H, d_v]
    return torch.stack(outputs, dim=2), (s if plant == "transposed" else s.transpose(-1, -2))


_DELTA_PLANTS = (("adds", ADDS_EVERYTHING), ("adds_no_beta", ADDS_EVERYTHING), ("stale_recall", STALE_RECALL),
                 ("decay_after", DECAY_AFTER), ("no_decay", NO_DECAY), ("not_exp", DECAY_NOT_EXP),
                 ("no_beta", NO_BETA), ("transposed", STATE_ORIENTATION), ("read_transposed", STATE_ORIENTATION),
                 ("out_transposed", STATE_ORIENTATION), ("read_before", READ_BEFORE_WRITE), ("no_scale", NO_SCALE),
                 ("default_scale", DEFAULT_SCALE))


def _delta_cases() -> list[tuple]:
    """``(q, k, v, g, beta, state, scale)``: square heads first (d_k = d_v, where a transposed state still runs),
    then d_k ≠ d_v; unit keys and queries (as Gated DeltaNet normalises them), decays well below 1, a non-zero
    initial state and a scale other than 1/√d_k."""
    generator = torch.Generator().manual_seed(131)
    cases = []
    for b, h, n, d_k, d_v, scale in [(2, 2, 6, 4, 4, 0.7), (1, 3, 7, 5, 3, 0.45)]:
        q, k = (F.normalize(torch.randn(b, h, n, d_k, generator=generator), dim=-1) for _ in range(2))
        v = torch.randn(b, h, n, d_v, generator=generator)
        g = -0.05 - 0.6 * torch.rand(b, h, n, generator=generator)                       # α between 0.5 and 0.95
        beta = 0.2 + 0.7 * torch.rand(b, h, n, generator=generator)
        state = torch.randn(b, h, d_k, d_v, generator=generator)
        cases.append((q, k, v, g, beta, state, scale))
    return cases


def _described(q, v, state, scale) -> str:
    return (f"q and k {_validate.shape_str(q)}, v {_validate.shape_str(v)}, g and beta {list(q.shape[:3])}, state "
            f"{_validate.shape_str(state)} (d_k = {q.shape[-1]}, d_v = {v.shape[-1]}) and scale {scale}")


def check_gated_delta_recurrence(recurrence_fn: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> bool:
    """Check ``fn(q, k [B, H, N, d_k], v [B, H, N, d_v], g, beta [B, H, N], state [B, H, d_k, d_v], scale)
    -> (out [B, H, N, d_v], state [B, H, d_k, d_v])``: the gated delta rule token by token,
    ``S_t = α_t S_{t-1} + β_t k_t (v_t − α_t S_{t-1}ᵀ k_t)ᵀ``, ``o_t = scale · S_tᵀ q_t``, ``α_t = exp(g_t)``,
    against a float64 loop written out here.

    Raises:
        TypeError: ``recurrence_fn`` is not callable.
        CheckFailed: naming every token added whole (linear attention), the correction read from the undecayed
            state, the decay after the write, no decay, g taken for α, no β, the state the other way round,
            outputs read before the write, the scale missing or 1/√d_k, the state returned transposed or
            unchanged, or the first entry that differs.

    Example (a wrong answer, and what it is told):
        >>> def decayed_sum(q, k, v, g, beta, state, scale):
        ...     outputs = []
        ...     for t in range(q.shape[2]):
        ...         write = k[:, :, t, :, None] * v[:, :, t, None, :]
        ...         state = g[:, :, t, None, None].exp() * state + beta[:, :, t, None, None] * write
        ...         outputs.append(scale * (q[:, :, t, :, None] * state).sum(-2))
        ...     return torch.stack(outputs, dim=2), state
        >>> check_gated_delta_recurrence(decayed_sum)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: You add every token to the state, S ← αS + β k vᵀ, as ...
    """
    where = "check_gated_delta_recurrence"
    if not callable(recurrence_fn):
        raise TypeError(f"{where}: expected your function, got {type(recurrence_fn).__name__}")
    for q, k, v, g, beta, state, scale in _delta_cases():
        result = call_answer(where, recurrence_fn, q, k, v, g, beta, state, scale,
                             described=_described(q, v, state, scale), forbidden=DELTA_RULES)
        out, new_state = returned_tensors(result, 2, "out, state")
        expected, expected_state = delta_rule_reference(q, k, v, g, beta, state, scale)
        square = q.shape[-1] == v.shape[-1]
        plants = [(message, delta_rule_reference(q, k, v, g, beta, state, scale, plant=plant)[0])
                  for plant, message in _DELTA_PLANTS if square or "transposed" not in plant]
        diagnose(out, expected, plants, ("", "head", "token", "feature"), "Your output")
        if new_state.shape == expected_state.shape[:-2] + expected_state.shape[-2:][::-1] and not square:
            raise CheckFailed(STATE_TRANSPOSED)
        diagnose(new_state, expected_state, [(STATE_TRANSPOSED, expected_state.transpose(-1, -2)),
                                             (STATE_NOT_UPDATED, state.double())],
                 ("", "head", "key feature", "value feature"), "Your state")
    return True


# --- 2. the indexer's top-k keys, causally -----------------------------------------------------------------------

CLASSMATES_TOP_K = ("This is the classmate's code as it was: it takes each query's top k over all N keys and masks "
                    "the future afterwards, so a query whose best keys lie ahead of it loses those places and keeps "
                    "fewer than min(k, i + 1) keys. Mask the future first (score -inf for key j > i), then take the "
                    "top k.")
SELECTS_FUTURE = ("Query {i} selects key {j}, which comes after it: a query may only choose among keys j ≤ i. Mask "
                  "the future before the top k.")
FUTURE_FOR_EARLY = ("Query {i} has only {count} key(s) to choose from (0 .. {i}), yet selects key {j}: top-k over a "
                    "row with fewer than k finite scores returns -inf entries too. Keep only the allowed ones "
                    "(& the causal mask), or take at most i + 1 per row.")
OWN_TOKEN = ("Your queries never select their own token: key j = i is allowed (j ≤ i, the diagonal included), and "
             "for query 0 it is the only key.")
TOO_FEW = "Query {i} keeps {got} key(s); it should keep min(k, i + 1) = {want}, its best among keys 0 .. {i}."
TOO_MANY = "Query {i} keeps {got} keys; it should keep min(k, i + 1) = {want}."
LOWEST = "You keep each query's lowest-scoring keys: top-k keeps the highest."
WRONG_KEYS = ("Query {i} keeps key {j} (score {low:.3f}) but leaves out key {m} (score {high:.3f}), an allowed key "
              "with a higher score.")
INDICES = ("You return the indices of the keys, {shape}: return the mask, bool [B, N, N], True where query i "
           "keeps key j (torch.zeros_like(scores, dtype=torch.bool).scatter(-1, indices, True)).")

_FIX_THE_SELECTION = "the exercise is to fix the classmate's selection, not to call the course's"
#: What the top-k exercise may not call: the course's causal top-k, or the layer that uses it.
TOP_K_RULES = forbid(_FIX_THE_SELECTION, "attn_course.variants.sparse_attention.top_k_keys",
                     "attn_course.variants.sparse_attention.SparseLatentAttention",
                     "attn_course.variants.block_selection._top_blocks")


def causal_top_k_reference(scores: torch.Tensor, k: int, *, plant: str | None = None) -> torch.Tensor:
    """``[B, N, N]`` bool: key ``j`` kept by query ``i`` when ``j ≤ i`` and fewer than ``k`` allowed keys score
    higher; by ranks, without ``topk``. ``plant="after"`` gives the classmate's (top k of all keys, then the
    mask), ``plant="lowest"`` the lowest scores."""
    n = scores.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    s = -scores.double() if plant == "lowest" else scores.double()
    allowed = torch.ones_like(causal) if plant == "after" else causal
    higher = (s[..., None, :] > s[..., :, None]) & allowed[:, None, :]                    # [B, N, N_j, N_m]
    return (higher.sum(-1) < k) & allowed & causal


def _top_k_cases() -> list[tuple[torch.Tensor, int]]:
    """``(scores [B, N, N], k)``: index scores for every pair, the future included (the indexer's mask is the
    exercise), then a k larger than the sequence."""
    generator = torch.Generator().manual_seed(132)
    return [(torch.randn(b, n, n, generator=generator) * 2.0, k) for b, n, k in [(2, 8, 3), (1, 12, 5), (3, 5, 8)]]


def _count_mistake(got: torch.Tensor, expected: torch.Tensor) -> str | None:
    """Which row first keeps the wrong number of keys, said, or None."""
    counts, wanted = got.sum(-1), expected.sum(-1)                                        # [B, N]
    wrong = (counts != wanted).nonzero()
    if not len(wrong):
        return None
    batch, i = (int(x) for x in wrong[0])
    have, want = int(counts[batch, i]), int(wanted[batch, i])
    return (TOO_FEW if have < want else TOO_MANY).format(i=i, got=have, want=want)


def check_causal_top_k(top_k_fn: Callable[[torch.Tensor, int], torch.Tensor]) -> bool:
    """Check ``fn(scores [B, N, N], k) -> [B, N, N] bool``: for each query ``i``, the ``min(k, i + 1)`` keys
    ``j ≤ i`` of highest index score, DeepSeek-V3.2's selection, against a reference by ranks written out here.

    Raises:
        TypeError: ``top_k_fn`` is not callable.
        CheckFailed: naming indices returned for a mask, the classmate's mask after the top k, a future key chosen
            (for the early queries only: -inf entries taken), the query's own token excluded, too few or too
            many keys, the lowest scores kept, or an allowed key of higher score left out.

    Example (a wrong answer, and what it is told):
        >>> def unmasked(scores, k):
        ...     best = scores.topk(min(k, scores.shape[-1]), dim=-1).indices
        ...     return torch.zeros_like(scores, dtype=torch.bool).scatter(-1, best, True)
        >>> check_causal_top_k(unmasked)
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: Query 0 selects key 5, which comes after it: a query may only ...
    """
    where = "check_causal_top_k"
    if not callable(top_k_fn):
        raise TypeError(f"{where}: expected your function, got {type(top_k_fn).__name__}")
    for scores, k in _top_k_cases():
        n = scores.shape[-1]
        described = f"scores {_validate.shape_str(scores)} and k = {k}" + (
            f" (more keys than the {n} tokens: keep min(k, i + 1) each)" if k > n else "")
        got = call_answer(where, top_k_fn, scores, k, described=described, forbidden=TOP_K_RULES)
        expected = causal_top_k_reference(scores, k)
        if isinstance(got, torch.Tensor) and got.dim() == 3 and got.shape[:2] == scores.shape[:2] \
                and got.shape[-1] == min(k, n) != n and not got.is_floating_point():
            raise CheckFailed(INDICES.format(shape=_validate.shape_str(got)))
        check_shape(got, expected, "Your mask")
        if torch.equal(got, expected):
            continue
        future = (got & ~torch.ones(n, n, dtype=torch.bool).tril()).nonzero()
        if len(future):
            rows = future[:, 1]
            _, i, j = (int(x) for x in future[0])
            early = bool((rows < k - 1).all())
            raise CheckFailed((FUTURE_FOR_EARLY if early else SELECTS_FUTURE).format(i=i, j=j, count=i + 1))
        if got.any() and not got.diagonal(dim1=-2, dim2=-1).any():
            raise CheckFailed(OWN_TOKEN)
        if torch.equal(got, causal_top_k_reference(scores, k, plant="after")):
            raise CheckFailed(CLASSMATES_TOP_K)
        count = _count_mistake(got, expected)
        if count:
            raise CheckFailed(count)
        if torch.equal(got, causal_top_k_reference(scores, k, plant="lowest")):
            raise CheckFailed(LOWEST)
        batch, i = (int(x) for x in (got != expected).any(-1).nonzero()[0])
        j = int((got[batch, i] & ~expected[batch, i]).nonzero()[0])
        m = int((expected[batch, i] & ~got[batch, i]).nonzero()[0])
        raise CheckFailed(WRONG_KEYS.format(i=i, j=j, m=m, low=scores[batch, i, j].item(),
                                            high=scores[batch, i, m].item()))
    return True
