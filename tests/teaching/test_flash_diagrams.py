"""Tests for attn_course.teaching.flash_diagrams: the tile classification against brute force, the kernel's
stage boundaries against it, the split of the keys for decoding, and what each figure draws."""

from __future__ import annotations

import itertools
import pathlib
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

from attn_course.teaching.flash_diagrams import (
    TILE_KINDS,
    decode_splits,
    flash_decoding,
    forward_key_stages,
    grouped_query_heads,
    tile_counts,
    tile_kinds,
    tile_schedule,
)

KERNELS = pathlib.Path(__file__).resolve().parents[2] / "attn_course" / "flash" / "kernels.py"

# (n_q, n_k): equal lengths, N_q < N_k (bottom-right, as after a KV cache), non-multiples of the
# tiles, a single query, lengths below one tile, and N_q > N_k (not causal).
LENGTHS = [(1, 1), (1, 300), (5, 5), (64, 64), (128, 128), (130, 130), (300, 300), (100, 700),
           (128, 1000), (200, 201), (7, 63), (63, 64), (65, 129), (256, 256), (300, 100), (130, 3)]
BLOCKS = [(128, 64), (64, 64), (64, 128), (16, 16), (32, 48), (1, 1), (128, 16)]
CASES = [(n_q, n_k, m, n, causal) for (n_q, n_k), (m, n), causal in itertools.product(LENGTHS, BLOCKS, (False, True))
         if -(-n_q // m) * -(-n_k // n) <= 400                     # keeps the brute force quick
         and not (causal and n_q > n_k)]                            # bottom-right causal needs N_q <= N_k


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


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
    for formula in ("DECODE_SPLIT_ALIGN=tl.constexpr(128)",
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


# --- figures ---------------------------------------------------------------------------------


def tile_patches(figure) -> list[Rectangle]:
    return [patch for patch in figure.axes[0].patches if patch.get_label().startswith("tile ")]


@pytest.mark.parametrize("n_q, n_k, block_m, block_n, causal", [(300, 300, 128, 64, True), (300, 300, 128, 64, False),
                                                                (100, 700, 64, 64, True), (1, 1000, 128, 64, True)])
def test_tile_schedule_draws_one_cell_per_tile_in_its_kinds_colour(n_q, n_k, block_m, block_n, causal):
    kinds = tile_kinds(n_q, n_k, block_m, block_n, causal=causal)
    figure = tile_schedule(n_q, n_k, block_m, block_n, causal=causal)
    patches = tile_patches(figure)
    assert len(patches) == len(kinds) * len(kinds[0])
    for patch in patches:
        t, s = (int(index) for index in patch.get_label().split()[1].rstrip(":").split(","))
        assert patch.get_xy() == (s * block_n, t * block_m)
        assert patch.get_facecolor() == to_rgba(TILE_KINDS[kinds[t][s]])
    legend = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert legend == [f"{kind}: {sum(row.count(kind) for row in kinds)}" for kind in TILE_KINDS]
    assert f"N_q = {n_q}, N_k = {n_k}" in figure.axes[0].get_title()


def test_grouped_query_heads_links_each_query_head_to_its_group():
    figure = grouped_query_heads(8, 2)
    axis = figure.axes[0]
    texts = [text.get_text() for text in axis.texts]
    assert [t for t in texts if t.startswith("q ")] == [f"q {h}" for h in range(8)]
    assert [t for t in texts if t.startswith("K/V head")] == ["K/V head 0", "K/V head 1"]
    assert [t for t in texts if t.startswith("dK")] == ["dK, dV: sum over q 0–3", "dK, dV: sum over q 4–7"]
    lines = axis.get_lines()
    assert len(lines) == 8
    centres = {0: 1.5, 1: 5.5}                                   # under the middle of each group of 4
    for h, line in enumerate(lines):
        assert list(line.get_xdata()) == [h, centres[h // 4]]
    assert "h // 4" in axis.get_title()


@pytest.mark.parametrize("num_heads, num_kv_heads", [(1, 1), (4, 4), (8, 1), (12, 3)])
def test_grouped_query_heads_draws_every_head(num_heads, num_kv_heads):
    axis = grouped_query_heads(num_heads, num_kv_heads).axes[0]
    texts = [text.get_text() for text in axis.texts]
    assert sum(t.startswith("q ") for t in texts) == num_heads
    assert sum(t.startswith("K/V head") for t in texts) == num_kv_heads
    assert len(axis.get_lines()) == num_heads


def test_flash_decoding_draws_a_chunk_and_a_program_per_split_and_arrows_into_the_merge():
    splits = decode_splits(1000, 4)
    axis = flash_decoding(1000, 4, 64).axes[0]
    texts = [text.get_text() for text in axis.texts]
    assert [t for t in texts if t.startswith("keys ")] == [f"keys {a}–{b - 1}" for a, b in splits]
    assert [t.splitlines()[0] for t in texts if t.startswith("program")] == [f"program {s}" for s in range(4)]
    assert sum(t.startswith("merge") for t in texts) == 1
    assert len([p for p in axis.patches if isinstance(p, FancyArrowPatch)]) == 2 * 4
    drawn = [p for p in axis.patches if p.get_label().startswith("split")]
    assert [(p.get_x(), p.get_x() + p.get_width()) for p in drawn] == [tuple(map(float, s)) for s in splits]


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize("function", [tile_kinds, tile_counts, forward_key_stages, tile_schedule])
@pytest.mark.parametrize("arguments, causal, error, name", [
    ((0, 10, 64, 64), False, ValueError, "n_q"),
    ((10, 10, 64, 0), False, ValueError, "block_n"),
    ((10.0, 10, 64, 64), False, TypeError, "n_q"),
    ((10, 10, True, 64), False, TypeError, "block_m"),
    ((10, 10, 64, 64), 1, TypeError, "causal"),
    ((20, 10, 64, 64), True, ValueError, "n_q <= n_k"),
])
def test_tile_functions_name_the_bad_argument(function, arguments, causal, error, name):
    with pytest.raises(error, match=name):
        function(*arguments, causal=causal)


def test_grouped_query_heads_needs_whole_groups():
    with pytest.raises(ValueError, match="num_heads must be a multiple of num_kv_heads"):
        grouped_query_heads(8, 3)
    with pytest.raises(ValueError, match="num_kv_heads"):
        grouped_query_heads(8, 0)
    with pytest.raises(TypeError, match="num_heads"):
        grouped_query_heads("8", 2)


def test_decode_functions_name_the_bad_argument():
    for function in (decode_splits, lambda *args: flash_decoding(*args, 64)):
        with pytest.raises(ValueError, match=r"num_splits must be at most max\(n_k // align, 1\) = 7"):
            function(1000, 8)
        with pytest.raises(ValueError, match="n_k"):
            function(0, 1)
        with pytest.raises(TypeError, match="num_splits"):
            function(1000, 4.0)
    with pytest.raises(ValueError, match="block_n must divide align=128"):
        flash_decoding(1000, 4, 48)
    with pytest.raises(TypeError, match="block_n"):
        flash_decoding(1000, 4, "64")
