"""Tests for attn_course.flash.schedule: the tile classification against brute force, the kernels' stage
boundaries against it and against the kernel source, and the split of the keys for decoding."""

from __future__ import annotations

import itertools
import pathlib
import re

import pytest
import torch

from attn_course.flash.schedule import decode_splits, forward_key_stages, tile_counts, tile_kinds

KERNELS = pathlib.Path(__file__).resolve().parents[2] / "attn_course" / "flash" / "kernels.py"

# (n_q, n_k): equal lengths, N_q < N_k (bottom-right, as after a KV cache), non-multiples of the
# tiles, a single query, lengths below one tile, and N_q > N_k (not causal).
LENGTHS = [(1, 1), (1, 300), (5, 5), (64, 64), (128, 128), (130, 130), (300, 300), (100, 700),
           (128, 1000), (200, 201), (7, 63), (63, 64), (65, 129), (256, 256), (300, 100), (130, 3)]
BLOCKS = [(128, 64), (64, 64), (64, 128), (16, 16), (32, 48), (1, 1), (128, 16)]
CASES = [(n_q, n_k, m, n, causal) for (n_q, n_k), (m, n), causal in itertools.product(LENGTHS, BLOCKS, (False, True))
         if -(-n_q // m) * -(-n_k // n) <= 400                     # keeps the brute force quick
         and not (causal and n_q > n_k)]                            # bottom-right causal needs N_q <= N_k


def visible(n_q: int, n_k: int, causal: bool) -> torch.Tensor:
    """``[N_q, N_k]``: True where query i sees key j (bottom-right causal), built position by position."""
    rows = torch.arange(n_q)[:, None]
    keys = torch.arange(n_k)[None, :]
    return keys <= rows + (n_k - n_q) if causal else torch.ones(n_q, n_k, dtype=torch.bool)


def brute_force_forward_kinds(n_q, n_k, block_m, block_n, causal) -> list[list[str]]:
    """The key loop's view: real query rows against every key slot of the tile, slots past N_k unseen."""
    seen = torch.zeros(n_q, -(-n_k // block_n) * block_n, dtype=torch.bool)
    seen[:, :n_k] = visible(n_q, n_k, causal)
    kinds = []
    for q_start in range(0, n_q, block_m):
        row = []
        for k_start in range(0, n_k, block_n):
            tile = seen[q_start:q_start + block_m, k_start:k_start + block_n]
            row.append("skipped" if not tile.any() else "unmasked" if tile.all() else "masked")
        kinds.append(row)
    return kinds


@pytest.mark.parametrize("n_q, n_k, block_m, block_n, causal", CASES)
def test_tile_kinds_match_brute_force_over_every_position(n_q, n_k, block_m, block_n, causal):
    assert tile_kinds(n_q, n_k, block_m, block_n, causal=causal) == \
        brute_force_forward_kinds(n_q, n_k, block_m, block_n, causal)


@pytest.mark.parametrize("n_q, n_k, block_m, block_n, causal", CASES)
def test_forward_stages_mask_every_partly_visible_tile_and_skip_only_invisible_ones(n_q, n_k, block_m, block_n, causal):
    kinds = brute_force_forward_kinds(n_q, n_k, block_m, block_n, causal)
    stages = forward_key_stages(n_q, n_k, block_m, block_n, causal=causal)
    assert len(stages) == len(kinds)
    for row, (unmasked_end, key_end) in zip(kinds, stages):
        assert unmasked_end % block_n == 0 and 0 <= unmasked_end <= key_end <= n_k
        for s, kind in enumerate(row):
            k_start = s * block_n
            stage = "unmasked" if k_start < unmasked_end else "masked" if k_start < key_end else "skipped"
            # Correctness needs only: no partly visible tile unmasked, no visible key skipped.
            if kind == "masked":
                assert stage == "masked"
            if kind != "skipped":
                assert stage != "skipped"
            # And the kernel's formulas are exact: it masks no tile that every row sees in full.
            assert stage == kind


def test_forward_stages_are_the_formulas_of_the_kernel_source():
    """forward_key_stages restates the kernel's boundaries; if the kernel changes them, update both."""
    source = re.sub(r"\s+", "", KERNELS.read_text(encoding="utf-8"))
    for formula in ("full_tiles_end=(n_k//BLOCK_N)*BLOCK_N",
                    "unmasked_end=tl.minimum(full_tiles_end,((tile*BLOCK_M+causal_offset+1)//BLOCK_N)*BLOCK_N)",
                    "key_end=tl.minimum(n_k,(tile+1)*BLOCK_M+causal_offset)",
                    "causal_offset=n_k-n_q"):
        assert formula in source, formula


def dkdv_stages(n_q, n_k, block_m, block_n, causal) -> list[tuple[int, int, int]]:
    """The dK/dV kernel's query stages per key tile, from attention_backward_dkdv_kernel."""
    offset = n_k - n_q
    full_tiles_end = (n_q // block_m) * block_m
    stages = []
    for tile in range(-(-n_k // block_n)):
        if causal:
            band_begin = (max(tile * block_n - offset, 0) // block_m) * block_m
            band_end = -(-max((tile + 1) * block_n - 1 - offset, 0) // block_m) * block_m
            band_end = max(min(band_end, full_tiles_end), band_begin)
        else:
            band_begin = band_end = 0
        stages.append((band_begin, band_end, full_tiles_end))
    return stages


@pytest.mark.parametrize("n_q, n_k, block_m, block_n, causal", CASES)
def test_dkdv_stages_mask_every_partly_visible_tile_and_skip_only_invisible_ones(n_q, n_k, block_m, block_n, causal):
    """The transposed loop: a key tile walks the query tiles; query rows past N_q are the padding here."""
    seen = torch.zeros(-(-n_q // block_m) * block_m, n_k, dtype=torch.bool)
    seen[:n_q] = visible(n_q, n_k, causal)
    for s, (band_begin, band_end, full_tiles_end) in enumerate(dkdv_stages(n_q, n_k, block_m, block_n, causal)):
        for q_start in range(0, n_q, block_m):
            tile = seen[q_start:q_start + block_m, s * block_n:(s + 1) * block_n]
            kind = "skipped" if not tile.any() else "unmasked" if tile.all() else "masked"
            if q_start < band_begin:
                stage = "skipped"
            elif q_start < band_end:
                stage = "masked"
            elif q_start < full_tiles_end:
                stage = "unmasked"
            else:
                stage = "masked"
            assert kind != "masked" or stage == "masked"
            assert kind == "skipped" or stage != "skipped"
            assert stage == kind                                    # exact here too


def test_tile_kinds_for_300_tokens_in_128_by_64_tiles():
    assert tile_kinds(300, 300, 128, 64, causal=False) == [["unmasked"] * 4 + ["masked"]] * 3
    assert tile_kinds(300, 300, 128, 64, causal=True) == [
        ["masked", "masked", "skipped", "skipped", "skipped"],
        ["unmasked", "unmasked", "masked", "masked", "skipped"],
        ["unmasked", "unmasked", "unmasked", "unmasked", "masked"],
    ]


@pytest.mark.parametrize("n_q, n_k, block_m, block_n, causal", CASES[::7])
def test_tile_counts_add_up_to_the_grid(n_q, n_k, block_m, block_n, causal):
    kinds = brute_force_forward_kinds(n_q, n_k, block_m, block_n, causal)
    counts = tile_counts(n_q, n_k, block_m, block_n, causal=causal)
    assert counts == {kind: sum(row.count(kind) for row in kinds) for kind in ("unmasked", "masked", "skipped")}
    assert sum(counts.values()) == -(-n_q // block_m) * -(-n_k // block_n)


def test_one_query_against_a_cache_sees_every_key():
    """Bottom-right causal with N_q = 1: the last position sees the whole cache, so nothing is skipped."""
    assert tile_kinds(1, 1000, 128, 64, causal=True) == tile_kinds(1, 1000, 128, 64, causal=False)


# --- decode_splits ---------------------------------------------------------------------------


@pytest.mark.parametrize("n_k, num_splits", [(1000, 4), (1000, 7), (128, 1), (100, 1), (1, 1), (5000, 7),
                                             (1024, 8), (999, 3), (130, 1)])
def test_decode_splits_cover_the_keys_in_order_in_whole_blocks(n_k, num_splits):
    splits = decode_splits(n_k, num_splits)
    assert len(splits) == num_splits
    assert splits[0][0] == 0 and splits[-1][1] == n_k
    assert all(end == start for (_, end), (start, _) in zip(splits, splits[1:]))
    assert all(start < end and start % 128 == 0 for start, end in splits)
    blocks = [(end - start) // 128 for start, end in splits[:-1]] + [(n_k // 128 * 128 - splits[-1][0]) // 128]
    assert max(blocks) - min(blocks) <= 1


def test_decode_splits_are_the_formulas_of_the_kernel_source():
    """decode_splits restates attention_decode_kernel's split; if the kernel changes it, update both."""
    source = re.sub(r"\s+", "", KERNELS.read_text(encoding="utf-8"))
    for formula in ("DECODE_SPLIT_ALIGN=tl.constexpr(configs.DECODE_SPLIT_ALIGN)",
                    "full_blocks=n_k//DECODE_SPLIT_ALIGN",
                    "key_begin=(split*full_blocks//num_splits)*DECODE_SPLIT_ALIGN",
                    "key_end=((split+1)*full_blocks//num_splits)*DECODE_SPLIT_ALIGN",
                    "key_end=tl.where(split==num_splits-1,n_k,key_end)"):
        assert formula in source, formula


def test_decode_splits_of_1000_keys_in_four():
    """7 full blocks of 128 dealt to 4 splits at 0, 7/4, 14/4, 21/4 blocks (rounded down); the tail to the last."""
    assert decode_splits(1000, 4) == [(0, 128), (128, 384), (384, 640), (640, 1000)]
    assert decode_splits(1000, 1) == [(0, 1000)]
    assert decode_splits(100, 1) == [(0, 100)]                # shorter than one block: one split


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize("function", [tile_kinds, tile_counts, forward_key_stages])
@pytest.mark.parametrize("arguments, causal, error, name", [
    ((0, 10, 64, 64), False, ValueError, "n_q"),
    ((10, 10, 64, 0), False, ValueError, "block_n"),
    ((10.0, 10, 64, 64), False, TypeError, "n_q"),
    ((10, 10, True, 64), False, TypeError, "block_m"),
    ((10, 10, 64, 64), 1, TypeError, "causal"),
    ((20, 10, 64, 64), True, ValueError, "n_q <= n_k"),
])
def test_tile_functions_name_the_bad_argument(function, arguments, causal, error, name):
    with pytest.raises(error, match=rf"{function.__name__}: .*{name}"):
        function(*arguments, causal=causal)


def test_decode_splits_name_the_bad_argument():
    with pytest.raises(ValueError, match=r"num_splits must be at most max\(n_k // align, 1\) = 7"):
        decode_splits(1000, 8)
    with pytest.raises(ValueError, match="n_k"):
        decode_splits(0, 1)
    with pytest.raises(TypeError, match="num_splits"):
        decode_splits(1000, 4.0)
