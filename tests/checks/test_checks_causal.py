"""attn_course.checks.causal, chapter 04's exercise checks: a right answer passes; each mistake,
and each planted mistake of tests/support/planted/planted_04.py, fails with its own message."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attn_course import causal_mask, self_attention
from attn_course.checks.causal import check_causal_mask, check_positions_without_cache
from attn_course.checks.decoding import check_cached_attention_step, check_decode_logits
from attn_course.checks.diagnosis import CheckFailed
from attn_course.checks.kv_cache import check_kv_cache_bytes
from attn_course.core.kv_cache import KVCache

from support.planted import planted_04

CHECKS = {
    "my_causal_mask": check_causal_mask,
    "positions_without_cache": check_positions_without_cache,
    "fixed_decode_logits": check_decode_logits,
    "cached_attention_step": check_cached_attention_step,
    "kv_cache_bytes": check_kv_cache_bytes,
}


def fails_with(check, answer, fragment: str) -> None:
    with pytest.raises(CheckFailed) as raised:
        check(answer)
    assert fragment in str(raised.value), str(raised.value)


# --- check_causal_mask --------------------------------------------------------------------------

def mask_by_loops(n_q: int, n_k: int) -> torch.Tensor:
    """The rule written out: query i sits at n_k - n_q + i and sees keys up to it."""
    return torch.tensor([[j <= n_k - n_q + i for j in range(n_k)] for i in range(n_q)])


def test_a_right_causal_mask_passes():
    assert check_causal_mask(mask_by_loops) is True
    fails_with(check_causal_mask, causal_mask, "calls causal_mask, which this exercise forbids")
    assert check_causal_mask(mask_by_loops, sizes=((1, 1), (5, 12), (6, 6))) is True


@pytest.mark.parametrize("answer, fragment", [
    (lambda n_q, n_k: torch.ones(n_q, n_k, dtype=torch.bool).tril(), "aligned to the top-left"),
    (lambda n_q, n_k: torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q - 1), "hides the diagonal"),
    (lambda n_q, n_k: ~mask_by_loops(n_q, n_k), "inverted"),
    (lambda n_q, n_k: torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q + 1), "one key past its own position"),
    (lambda n_q, n_k: mask_by_loops(n_q, n_k).int(), "dtype torch.int32"),
    # 0 where it may attend, -inf where not: the additive form, not an inverted mask
    (lambda n_q, n_k: torch.zeros(n_q, n_k).masked_fill(~mask_by_loops(n_q, n_k), float("-inf")),
     "Your mask is additive: 0 where a query may attend and -inf where it may not"),
    (lambda n_q, n_k: torch.zeros(n_q, n_k).masked_fill(~mask_by_loops(n_q, n_k), -1e9), "and -1e+09 where"),
    (lambda n_q, n_k: mask_by_loops(n_k, n_k), "n_q=2, n_k=5 has shape [5, 5], but it needs"),
    (lambda n_q, n_k: mask_by_loops(n_q, n_k).tolist(), "returned list"),
    (lambda n_q, n_k: ..., "returns nothing yet"),
    (lambda n_q, n_k: 1 / 0, "raised ZeroDivisionError"),
])
def test_each_causal_mask_mistake_is_named(answer, fragment):
    fails_with(check_causal_mask, answer, fragment)


def test_an_unknown_mask_mistake_points_at_the_entry():
    def wrong(n_q, n_k):
        mask = mask_by_loops(n_q, n_k)
        mask[-1, 0] = False
        return mask

    fails_with(check_causal_mask, wrong, "wrong at query 3, key 0: expected True, got False")


# --- check_positions_without_cache --------------------------------------------------------------

def test_a_right_count_passes():
    assert check_positions_without_cache(lambda P, T: T * P + T * (T - 1) // 2) is True
    assert check_positions_without_cache(lambda P, T: sum(range(P, P + T))) is True


@pytest.mark.parametrize("answer, fragment", [
    (lambda P, T: T * P + T * (T + 1) // 2, "one position too many per step"),
    (lambda P, T: T * (T - 1) // 2, "leaves out the prompt"),
    (lambda P, T: T * (T + 1) // 2, "leaves out the prompt"),
    (lambda P, T: P + T * (T - 1) // 2, "counted the prompt once"),
    (lambda P, T: P + T - 1, "count with a cache"),
    (lambda P, T: T * (P + T), "as long as the last one"),
    (lambda P, T: T * P + T * (T - 1) / 2, "is a float, not a Python int"),
    (lambda P, T: torch.tensor(T * P + T * (T - 1) // 2), "is a tensor, not a Python int"),
    (lambda P, T: 6550, "for P=1, T=1 is 6550; it should be 1"),
])
def test_each_count_mistake_is_named(answer, fragment):
    fails_with(check_positions_without_cache, answer, fragment)


# --- check_decode_logits ------------------------------------------------------------------------

def decode_with(*, positions_from=lambda start: start, use_cache=True):
    def decode(model, new_ids, caches):
        start = positions_from(len(caches[0]))
        x = model.token_embedding(new_ids) + model.position_embedding(torch.arange(start, start + new_ids.shape[1]))
        for block, cache in zip(model.blocks, caches):
            x, _ = block(x, kv_cache=cache if use_cache else None)
        return model.head(model.final_norm(x))

    return decode


def test_a_right_cached_forward_passes():
    assert check_decode_logits(decode_with()) is True
    fails_with(check_decode_logits, lambda model, new_ids, caches: model(new_ids, kv_caches=caches),
               "calls TinyLanguageModel.forward, which this exercise forbids")
    assert check_decode_logits(decode_with(), seed=3, chunks=(1, 1, 1, 3, 2)) is True


def test_the_reference_is_the_full_pass_of_an_independent_model():
    """The check's claim, tested without it: feeding chunks through the model with caches
    gives the logits of one full pass (so the check compares with the right thing)."""
    from attn_course.models.tiny_language_model import LanguageModelConfig, TinyLanguageModel

    torch.manual_seed(5)
    model = TinyLanguageModel(LanguageModelConfig(vocab_size=7, max_length=10, num_layers=2)).eval()
    ids = torch.randint(0, 7, (1, 9))
    caches = [KVCache() for _ in model.blocks]
    with torch.no_grad():
        pieces = [decode_with()(model, ids[:, a:b], caches) for a, b in [(0, 4), (4, 5), (5, 7), (7, 9)]]
        torch.testing.assert_close(torch.cat(pieces, dim=1), model(ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("answer, fragment", [
    (decode_with(positions_from=lambda start: 0), "positions restart at 0"),
    (decode_with(positions_from=lambda start: start + 1), "one too far"),
    (decode_with(use_cache=False), "ignores the cache"),
    (decode_with(positions_from=lambda start: 0, use_cache=False), "ignores the cache"),
    (lambda model, new_ids, caches: decode_with()(model, new_ids, caches)[:, -1], "have shape [2, 11]; expected"),
    (lambda model, new_ids, caches: decode_with()(model, new_ids[:, :, None], caches), "raised"),
    (lambda model, new_ids, caches: None, "returns nothing yet"),
])
def test_each_cached_forward_mistake_is_named(answer, fragment):
    fails_with(check_decode_logits, answer, fragment)


def test_an_unknown_cached_forward_mistake_says_where_it_first_differs():
    def doubled(model, new_ids, caches):
        return 2 * decode_with()(model, new_ids, caches)

    fails_with(check_decode_logits, doubled, "first at position 0")


# --- check_cached_attention_step ----------------------------------------------------------------

def step_with(*, causal="bottom-right", padding="left", use_past=True, new_first=False, drop_past=False,
              scale=None, empty_rows="zeros"):
    """A cached step over a left-padded batch, written from the rule with a softmax by hand; the
    options plant one mistake each."""
    def step(q, k, v, past_keys, past_values, lengths):
        keys = torch.cat([k, past_keys] if new_first else [past_keys, k], dim=-2)
        values = torch.cat([v, past_values] if new_first else [past_values, v], dim=-2)
        attend_k, attend_v = (keys, values) if use_past else (k, v)
        n_q, n_all, n_k = q.shape[-2], keys.shape[-2], attend_k.shape[-2]
        slot = torch.arange(n_all - n_k, n_all)                                         # the attended slots
        first_token = {"left": n_all - lengths, "one short": n_all - lengths, "none": torch.zeros_like(lengths),
                       "first": (n_all - lengths[0]).expand(len(lengths)),
                       "longest": (n_all - lengths.max()).expand(len(lengths)),
                       "shortest": (n_all - lengths.min()).expand(len(lengths))}
        real = slot < lengths[:, None] if padding == "right" else slot >= first_token[padding][:, None]   # [B, N_k]
        if padding == "one short":                                                        # > for >=
            real = slot > (n_all - lengths)[:, None]
        query_slot = torch.arange(n_q)[:, None] + (n_all - n_q)                           # [N_q, 1]
        if causal == "bottom-right":
            allowed = (slot <= query_slot)[None]
        elif causal == "within-sequence":          # the query counted from its first token, the key by slot
            allowed = slot <= (lengths[:, None, None] - n_q + torch.arange(n_q)[:, None])
        elif causal == "top-left":
            allowed = (slot <= torch.arange(n_q)[:, None])[None]
        else:
            allowed = torch.ones(1, n_q, n_k, dtype=torch.bool)
        allowed = (allowed & real[:, None, :])[:, None]                                   # [B, 1, N_q, N_k]
        scores = q @ attend_k.transpose(-2, -1) / (scale or math.sqrt(q.shape[-1]))       # [B, H, N_q, N_k]
        scores = scores.masked_fill(~allowed, -1e9 if empty_rows == "uniform" else float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        if empty_rows == "zeros":
            weights = weights.nan_to_num(0.0)                                             # a row that sees nothing
        output = weights @ attend_v
        if causal == "sdpa":
            output = F.scaled_dot_product_attention(q, attend_k, attend_v, is_causal=True)
        return output, (k if drop_past else keys), (v if drop_past else values)

    return step


def test_a_right_cached_step_passes():
    assert check_cached_attention_step(step_with()) is True
    assert check_cached_attention_step(step_with(), seed=4, prompt_lengths=(1, 6, 2, 6), chunks=(3, 1)) is True
    assert check_cached_attention_step(lambda *args: list(step_with()(*args))) is True


def test_the_reference_is_causal_attention_over_each_sequence_alone():
    """Without the check: a left-padded batch decoded with the right step, prompts first and then
    a token at a time, gives each sequence what torch's SDPA (is_causal=True, N_q = N_k) gives on
    its tokens alone, and zeros in the padded rows; so that is what the check demands."""
    torch.manual_seed(0)
    prompts, new = [3, 1], 2
    q, k, v = (torch.randn(2, 2, 3 + new, 4) for _ in range(3))                        # [B, H, S, d]
    for t in (q, k, v):
        t[1, :, :2] = 100.0                                                               # sequence 1's padding
    lengths = torch.tensor(prompts)
    output, past_k, past_v = step_with()(q[..., :3, :], k[..., :3, :], v[..., :3, :], k[..., :0, :], v[..., :0, :],
                                         lengths)
    outputs = [output]
    for i in range(3, 3 + new):
        lengths = lengths + 1
        output, past_k, past_v = step_with()(q[..., i:i + 1, :], k[..., i:i + 1, :], v[..., i:i + 1, :], past_k,
                                             past_v, lengths)
        outputs.append(output)
    got = torch.cat(outputs, dim=-2)
    torch.testing.assert_close(got[:1], F.scaled_dot_product_attention(q[:1], k[:1], v[:1], is_causal=True))
    torch.testing.assert_close(got[1:, :, 2:], F.scaled_dot_product_attention(q[1:, :, 2:], k[1:, :, 2:],
                                                                              v[1:, :, 2:], is_causal=True))
    assert torch.equal(got[1, :, :2], torch.zeros(2, 2, 4))


@pytest.mark.parametrize("answer, fragment", [
    (step_with(padding="none"), "attends to the padding"),
    (step_with(padding="right"), "assumes the padding comes after the tokens"),
    (step_with(padding="one short"), "takes each sequence's first token for padding"),
    (step_with(padding="first"), "as many tokens as the first one"),
    (step_with(padding="longest"), "attends to the padding"),                 # the longest prompt has no padding
    (step_with(causal="within-sequence"), "position within its own sequence"),
    (step_with(empty_rows="nan"), "padded query slots are NaN, not zeros"),
    (step_with(empty_rows="uniform"), "padded query slots are averages of values"),
    (step_with(causal="sdpa"), "aligned to the top-left"),
    (step_with(causal="none"), "uses no causal mask"),
    (step_with(use_past=False), "attends only to the new keys"),
    (step_with(new_first=True), "put the new tokens before the cached ones"),
    (step_with(drop_past=True), "keys after 5 cached and 1 new slots has shape [3, 2, 1, 8]"),
    (lambda *args: step_with()(*args)[0], "returned a Tensor"),
    (lambda *args: step_with()(*args)[:2], "a tuple of length 2"),
    (step_with(scale=1.0), "forgot the scaling"),
    (step_with(scale=2 * math.sqrt(8)), "first at sequence 0, slot 3"),     # slot 2, its first token, sees itself only
])
def test_each_cached_step_mistake_is_named(answer, fragment):
    fails_with(check_cached_attention_step, answer, fragment)


def test_a_padding_taken_from_the_shortest_sequence_is_named():
    fails_with(lambda answer: check_cached_attention_step(answer, prompt_lengths=(4, 2, 3)),
               step_with(padding="shortest"), "as many tokens as the shortest")


def test_a_cached_step_with_scrambled_keys_is_told_so():
    def scrambled(*args):
        output, keys, values = step_with()(*args)
        return output, keys.flip(-2), values

    fails_with(check_cached_attention_step, scrambled, "not the cached slots followed by the new ones")


def test_the_check_refuses_prompts_without_a_token():
    with pytest.raises(ValueError, match=r"^check_cached_attention_step: prompt_lengths and chunks"):
        check_cached_attention_step(step_with(), prompt_lengths=(2, 0))


# --- the planted mistakes that test_assignments grades ------------------------------------------

PLANTED = [(student, name, *entry) for student, functions in planted_04.PLANTED.items()
           for name, entry in functions.items()]


@pytest.mark.parametrize("student, name, code, question, hint", PLANTED, ids=[f"{s}-{n}" for s, n, *_ in PLANTED])
def test_each_planted_mistake_gets_its_hint(student, name, code, question, hint):
    namespace = {"torch": torch, "math": math, "causal_mask": causal_mask, "self_attention": self_attention,
                 "KVCache": KVCache}
    exec(code, namespace)
    fails_with(CHECKS[name], namespace[name], hint)
