"""attn_course.checks.kv_cache: a right prediction passes; each planted mistake gets its own message."""

from __future__ import annotations

import pytest
import torch

from attn_course.checks.diagnosis import CheckFailed
from attn_course.checks.kv_cache import check_kv_cache_bytes, filled_cache


def predict(batch, num_kv_heads, head_dim, dtype, prompt_tokens, new_tokens, *, only_keys=False, bits=False,
            four_bytes=False, swap=False, no_room=False, power_of_two=False, as_tensors=False):
    """A prediction from the rule, written without the cache: room for the prompt, doubled when full."""
    size = 4 if four_bytes else torch.tensor([], dtype=dtype).element_size() * (8 if bits else 1)
    per_token = (1 if only_keys else 2) * batch * num_kv_heads * head_dim * size
    tokens = prompt_tokens + new_tokens
    capacity = prompt_tokens
    while capacity < tokens:
        capacity *= 2
    if no_room:
        capacity = tokens
    if power_of_two:
        capacity = 1 << (tokens - 1).bit_length()
    stored, allocated = per_token * tokens, per_token * capacity
    if as_tensors:
        stored, allocated = torch.tensor(stored), torch.tensor(allocated)
    return (allocated, stored) if swap else (stored, allocated)


def with_(**mistake):
    return lambda *args: predict(*args, **mistake)


def test_filled_cache_grows_by_doubling():
    cache = filled_cache(1, 2, 8, torch.bfloat16, prompt=5, new=7)
    assert (len(cache), cache.capacity) == (12, 20)
    assert cache.memory_bytes == 2 * 1 * 2 * 20 * 8 * 2


def test_a_right_prediction_passes():
    assert check_kv_cache_bytes(predict) is True
    assert check_kv_cache_bytes(with_(as_tensors=True)) is True         # 0-d tensors count as numbers
    assert check_kv_cache_bytes(lambda *a: list(predict(*a))) is True


PLANTED = {
    "only the keys": (with_(only_keys=True), "counted only the keys"),
    "bits for bytes": (with_(bits=True), "counted bits, not bytes"),
    "four bytes always": (with_(four_bytes=True), "assumed 4 bytes per number"),
    "swapped": (with_(swap=True), "returned (allocated, stored)"),
    "no room ahead": (with_(no_room=True), "allocates ahead"),
    "power of two": (with_(power_of_two=True), "power of two"),
}


@pytest.mark.parametrize("mistake", list(PLANTED))
def test_a_planted_mistake_is_named(mistake):
    fn, message = PLANTED[mistake]
    with pytest.raises(CheckFailed) as raised:
        check_kv_cache_bytes(fn)
    assert message in str(raised.value)


def test_an_unknown_mistake_names_the_case_and_the_number():
    def off_by_one(*args):
        stored, allocated = predict(*args)
        return stored, allocated + 1

    with pytest.raises(CheckFailed, match=r"allocated bytes are not right for batch=2.*expected 5120, got 5121"):
        check_kv_cache_bytes(off_by_one)


@pytest.mark.parametrize("answer, message", [
    (lambda *a: ..., "returns nothing yet"),
    (lambda *a: 7, "two numbers"),
    (lambda *a: ("a", 1), "should be a number"),
    (lambda *a: 1 / 0, "raised ZeroDivisionError"),
])
def test_answers_that_are_not_two_numbers_are_named(answer, message):
    with pytest.raises(CheckFailed, match=message):
        check_kv_cache_bytes(answer)
