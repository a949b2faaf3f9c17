"""Check chapter 09's exercise 3: what one decoding step of multi-head latent attention stores and multiplies
per cached token and layer, absorbed (multi-query attention on the latent) or expanded (per-head keys and
values), counted here from the configuration's sizes."""

from __future__ import annotations

import numbers
from collections.abc import Callable

import torch

from attn_course.checks.diagnosis import CheckFailed, call_answer, name_mistake, watched
from attn_course.checks.forbidden import forbid

__all__ = ["DECODE_FORMS", "check_decode_costs"]

DECODE_FORMS = ("absorbed", "expanded")

FORMS_SWAPPED = ("Your two forms are swapped: for form={form!r} you return what the other form costs. Absorbed, "
                 "every head scores each cached token against its one shared key [c_KV; k_R] and mixes its one "
                 "shared value c_KV; expanded, each head reads its own rebuilt key and value.")
ORDER_SWAPPED = ("You return (multiply-adds, numbers cached); the exercise asks for (numbers cached, "
                 "multiply-adds), in that order.")
NO_ROPE = ("You left out the rotary part. Every key has one: the shared k_R (qk_rope_head_dim numbers) in the "
           "absorbed form, qk_rope_head_dim features of each head's key in the expanded one. It is cached, and "
           "every score multiplies it too.")
VALUE_WIDTH_IN_KEY = ("You counted the value's width in the key. A score is the query times the key: "
                      "qk_nope_head_dim + qk_rope_head_dim features per head when expanded, kv_lora_rank + "
                      "qk_rope_head_dim when absorbed. The value (v_head_dim per head expanded, c_KV absorbed) only "
                      "comes in afterwards, added to the head's output with the token's weight.")
NOT_PER_HEAD = ("You counted one head. Each of the num_attention_heads heads scores every cached token and adds its "
                "value in, so multiply by the heads: in the absorbed form they share what is cached, but each does "
                "its own multiply-adds.")
LATENT_PER_HEAD = ("You count the absorbed cache once per head. Every head reads the same [c_KV; k_R]: it is stored "
                   "once per token and layer, kv_lora_rank + qk_rope_head_dim numbers, and that is its saving.")
ROPE_PER_HEAD = ("You cache a rotary key for every head in the absorbed form. MLA's decoupled k_R is shared by all "
                 "heads: one qk_rope_head_dim vector per token and layer.")
VALUE_CACHED_TWICE = ("You cache the absorbed value separately. It is c_KV itself, already in the cache as the first "
                      "kv_lora_rank numbers of the key [c_KV; k_R]: nothing more is stored for it.")
SCORES_ONLY = ("You counted the scores only. After the softmax each head adds every cached token's value into its "
               "output, with the token's weight: v_head_dim multiply-adds per head expanded, kv_lora_rank absorbed "
               "(the value is c_KV).")
ROPE_IN_VALUE = ("Your absorbed value is the whole key [c_KV; k_R]. The value is c_KV alone (kv_lora_rank "
                 "numbers): k_R only enters the score.")
EXPANDED_SHARED_ROPE = ("Expanded, each head caches its whole key as multi-head attention does: its qk_nope_head_dim "
                        "content features and its own copy of the qk_rope_head_dim rotary ones, then its value.")
COSTS_WRONG = ("For form={form!r} with {case}, your {wrong} not right (you return ({got_cached}, {got_work})). "
               "Count per cached token and layer: the numbers stored for it, and the multiply-adds of one new "
               "query token's score with its key and of adding its value in, over all heads.")

DECODE_CASES = [
    # DeepSeek-V2 (arXiv 2405.04434, §3.1.2; its Hugging Face config.json), extra keys and all
    dict(num_hidden_layers=60, hidden_size=5120, num_attention_heads=128, kv_lora_rank=512, q_lora_rank=1536,
         qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128),
    dict(num_attention_heads=16, kv_lora_rank=256, qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=96),
    dict(num_attention_heads=6, kv_lora_rank=40, qk_rope_head_dim=8, qk_nope_head_dim=24, v_head_dim=16),
]


def _decode_reference(case: dict, form: str) -> tuple[int, int]:
    """(numbers cached, multiply-adds) per cached token and layer, for one new query token, all heads."""
    heads, latent, rope = case["num_attention_heads"], case["kv_lora_rank"], case["qk_rope_head_dim"]
    content, value = case["qk_nope_head_dim"], case["v_head_dim"]
    if form == "absorbed":       # multi-query attention on the latent: key [c_KV; k_R], value c_KV, shared
        return latent + rope, heads * ((latent + rope) + latent)
    return heads * (content + rope + value), heads * ((content + rope) + value)       # each head's own K and V


def _decode_mistakes(case: dict, form: str) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(message, wrong count) for the numbers cached and for the multiply-adds."""
    heads, latent, rope = case["num_attention_heads"], case["kv_lora_rank"], case["qk_rope_head_dim"]
    content, value = case["qk_nope_head_dim"], case["v_head_dim"]
    if form == "absorbed":
        cached = [(NO_ROPE, latent), (LATENT_PER_HEAD, heads * (latent + rope)), (ROPE_PER_HEAD, latent + heads * rope),
                  (VALUE_CACHED_TWICE, 2 * latent + rope)]
        work = [(NO_ROPE, heads * 2 * latent), (NO_ROPE, heads * latent), (NOT_PER_HEAD, 2 * latent + rope),
                (SCORES_ONLY, heads * (latent + rope)), (ROPE_IN_VALUE, heads * 2 * (latent + rope)),
                (VALUE_WIDTH_IN_KEY, heads * (3 * latent + rope))]
        return cached, work
    cached = [(NO_ROPE, heads * (content + value)), (EXPANDED_SHARED_ROPE, heads * (content + value) + rope),
              (VALUE_WIDTH_IN_KEY, heads * (value + rope + value)),
              (VALUE_WIDTH_IN_KEY, heads * (content + rope + 2 * value)), (NOT_PER_HEAD, content + rope + value)]
    work = [(NO_ROPE, heads * (content + value)), (SCORES_ONLY, heads * (content + rope)),
            (VALUE_WIDTH_IN_KEY, heads * (value + rope + value)),
            (VALUE_WIDTH_IN_KEY, heads * (content + rope + 2 * value)), (NOT_PER_HEAD, content + rope + value)]
    return cached, work


def _case_text(case: dict) -> str:
    return ", ".join(f"{name}={value}" for name, value in case.items())


def _two_counts(got: object) -> tuple[float, float]:
    if isinstance(got, (tuple, list)) and len(got) == 2:
        counts = [value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value for value in got]
        if all(isinstance(value, numbers.Real) and not isinstance(value, bool) for value in counts):
            return counts[0], counts[1]
    raise CheckFailed(f"Your function should return two numbers, (numbers cached, multiply-adds), got {got!r}.")


_COUNT_IT_YOURSELF = "the exercise is to count from section 5's definitions yourself"
#: What chapter 09's decoding-cost exercise may not call: the course's cache sizes and its MLA itself.
DECODE_COSTS_RULES = forbid(
    _COUNT_IT_YOURSELF,
    "attn_course.variants.kv_cache_size.mla_cache_elements",
    "attn_course.variants.kv_cache_size.mha_cache_elements",
    "attn_course.variants.kv_cache_size.gqa_cache_elements",
    "attn_course.variants.kv_cache_size.mqa_cache_elements",
    "attn_course.variants.kv_cache_size.cache_size_from_config",
    "attn_course.variants.kv_cache_size.CacheSize",
    "attn_course.variants.kv_cache_size.cache_bytes_rows",
    "attn_course.variants.latent_attention.MultiHeadLatentAttention",
    "attn_course.variants.latent_cache.LatentCache",
)


def check_decode_costs(costs_fn: Callable[[dict, str], tuple[int, int]]) -> bool:
    """Check ``fn(config, form) -> (cached, multiply_adds)``: what one decoding step of multi-head latent
    attention costs per cached token and layer, ``form`` ``"absorbed"`` or ``"expanded"``.

    ``config`` is a DeepSeek-V2-style dict. ``cached`` is the numbers stored per token, ``multiply_adds``
    those one new query token spends on one cached token over all heads (its score with the token's key,
    and the token's value added in). Tried on DeepSeek-V2 and two other configurations.

    Raises:
        CheckFailed: naming the two forms swapped, the two counts in the wrong order, the rotary part
            left out, the value's width counted in the key, one head counted instead of all, the
            latent or the rotary key cached per head, the absorbed value cached twice or taken as the
            whole key, the scores without the values, the expanded rotary key shared, a forbidden call,
            or else the first configuration and form that differ, and which of the two counts.

    Example (a wrong answer, and what it is told):
        >>> from attn_course.variants.kv_cache_size import mla_cache_elements
        >>> check_decode_costs(lambda config, form: (mla_cache_elements(512, 64), 0))
        Traceback (most recent call last):
        ...
        attn_course.checks.diagnosis.CheckFailed: check_decode_costs: your answer calls mla_cache_elements, ...
    """
    costs_fn = watched("check_decode_costs", costs_fn, DECODE_COSTS_RULES)
    for case in DECODE_CASES:
        for form in DECODE_FORMS:
            got = _two_counts(call_answer("check_decode_costs", costs_fn, dict(case), form,
                                          described=f"config={{{_case_text(case)}}}, form={form!r}"))
            expected = _decode_reference(case, form)
            if got == expected:
                continue
            other = _decode_reference(case, DECODE_FORMS[1 - DECODE_FORMS.index(form)])
            if got == other:
                raise CheckFailed(FORMS_SWAPPED.format(form=form))
            if got == expected[::-1]:
                raise CheckFailed(ORDER_SWAPPED)
            for count, wanted, mistakes in zip(got, expected, _decode_mistakes(case, form)):
                if count != wanted:
                    name_mistake(count, mistakes)
            wrong = {(True, False): "number cached is", (False, True): "count of multiply-adds is"}.get(
                (got[0] != expected[0], got[1] != expected[1]), "number cached and count of multiply-adds are")
            raise CheckFailed(COSTS_WRONG.format(form=form, case=_case_text(case), wrong=wrong, got_cached=got[0],
                                                 got_work=got[1]))
    return True
