"""attn_course.measure.distributed.critical_path: the ring's critical path, per step, against formulas written here.

One launch per world size (P = 2, 3, 4) runs all three layouts; the launches are cached, so the planted
faults (the sum over ranks in place of the max, the layouts' results shifted by one) reuse them and
start no process.
"""

from __future__ import annotations

from fractions import Fraction
from unittest import mock

import pytest

from attn_course.distributed.launch import launch
from attn_course.measure import distributed
from attn_course.measure.distributed import critical_path, ranks

N = 48                                            # divisible by 2P for P = 2, 3, 4
WORLD_SIZES = (2, 3, 4)
LAYOUTS = ("contiguous", "zigzag", "striped")


_LAUNCHED: dict = {}


def launched(fn, world_size, tasks, **options):
    """launch, run once per list of tasks: a second measure_critical_path reads the same ranks' reports."""
    key = (fn, world_size, tuple(tasks))
    if key not in _LAUNCHED:
        _LAUNCHED[key] = launch(fn, world_size, tasks, **options)
    return _LAUNCHED[key]


def measure(layouts=LAYOUTS) -> list:
    with mock.patch.object(ranks, "launch", launched):
        return distributed.measure_critical_path(WORLD_SIZES, n=N, layouts=layouts, heads=2, head_dim=4, repeats=1)


def scores_by_hand(layout: str, world_size: int, n: int) -> list[list[int]]:
    """``[rank][step]`` score elements computed, a masked tile counted whole, from the algorithm: at step s
    rank r holds rank (r - s) mod P's block."""
    block, chunk = (n // world_size) ** 2, (n // (2 * world_size)) ** 2
    table = []
    for rank in range(world_size):
        row = []
        for step in range(world_size):
            source = (rank - step) % world_size
            if layout == "contiguous":
                row.append(block if source <= rank else 0)       # keys all before (or the diagonal), or skipped
            elif layout == "zigzag":
                row.append(3 * chunk if step == 0 else 2 * chunk)  # own block: 3 tiles; any other: 2
            else:
                row.append(block)                                 # striped: one masked tile, computed whole
        table.append(row)
    return table


def expected_steps(layout: str, world_size: int, n: int) -> list[int]:
    """Per step, the most any rank computes: (N/P)² (contiguous, striped); 3 (N/2P)², then 2 (N/2P)² (zig-zag)."""
    if layout == "zigzag":
        return [3 * (n // (2 * world_size)) ** 2] + [2 * (n // (2 * world_size)) ** 2] * (world_size - 1)
    return [(n // world_size) ** 2] * world_size


def check_against_the_formulas(rows) -> None:
    assert [(r.world_size, r.layout) for r in rows] == [(p, layout) for p in WORLD_SIZES for layout in LAYOUTS]
    for r in rows:
        context = f"{r.layout}, P={r.world_size}"
        assert [list(s) for s in r.scores_by_rank] == scores_by_hand(r.layout, r.world_size, N), context
        assert list(r.step_max_scores) == expected_steps(r.layout, r.world_size, N), context
        assert r.critical_path == sum(expected_steps(r.layout, r.world_size, N)) == r.formula, context


def test_measured_per_step_maxima_equal_the_formulas_at_p_2_3_4():
    rows = measure()
    check_against_the_formulas(rows)
    path = {(r.layout, r.world_size): r.critical_path for r in rows}
    for p in WORLD_SIZES:
        assert path["contiguous", p] == N * N // p                                     # N²/P
        assert Fraction(path["zigzag", p], N * N) == Fraction(2 * p + 1, 4 * p * p)   # (2P+1)·N²/(4P²)
        assert path["striped", p] == N * N // p                                        # whole masked tiles
    assert Fraction(path["contiguous", 4], path["zigzag", 4]) == Fraction(16, 9)      # 4P/(2P+1), not 4
    speedups = {(r.layout, r.world_size): r.speedup_over_contiguous for r in rows}
    assert speedups["zigzag", 4] == pytest.approx(16 / 9) and speedups["striped", 4] == 1.0
    assert speedups["contiguous", 2] == 1.0
    for r in rows:                                                       # timed, one per step; not compared
        assert len(r.step_max_seconds) == r.world_size and all(s >= 0 for s in r.step_max_seconds)


def test_the_sum_over_ranks_in_place_of_the_max_fails_the_comparison():
    with mock.patch.object(critical_path, "_slowest", lambda per_rank: [sum(step) for step in zip(*per_rank)]):
        rows = measure()
    with pytest.raises(AssertionError):
        check_against_the_formulas(rows)


def test_results_attributed_to_the_wrong_layout_fail_the_comparison():
    """A rank program that reports its layouts shifted by one: contiguous gets zig-zag's counts, and so on."""
    def shifted(fn, world_size, tasks, **options):
        return [found[1:] + found[:1] for found in launched(fn, world_size, tasks, **options)]

    with mock.patch.object(ranks, "launch", shifted):
        rows = distributed.measure_critical_path(WORLD_SIZES, n=N, layouts=LAYOUTS, heads=2, head_dim=4, repeats=1)
    with pytest.raises(AssertionError):
        check_against_the_formulas(rows)
    # Contiguous and striped have the same per-step maxima; only the per-rank counts tell them apart.
    assert expected_steps("contiguous", 4, N) == expected_steps("striped", 4, N)
    assert scores_by_hand("contiguous", 4, N) != scores_by_hand("striped", 4, N)


@pytest.mark.parametrize(
    "call, error, fragment",
    [
        (lambda: distributed.measure_critical_path((4,), n=12), ValueError,
         r"^measure_critical_path: the sequence length N=12 must be divisible by 8 for the zigzag layout over 4 ranks"),
        (lambda: distributed.measure_critical_path((2,), layouts=("contiguous", "diagonal")), ValueError,
         r"^measure_critical_path: layouts\[1\] must be one of"),
        (lambda: distributed.measure_critical_path((2,), layouts=()), ValueError, "and at least one"),
        (lambda: distributed.measure_critical_path((2,), layouts=("zigzag", "zigzag")), ValueError, "each layout once"),
        (lambda: distributed.measure_critical_path((2,), layouts="zigzag"), TypeError, "layouts must be a sequence"),
        (lambda: distributed.measure_critical_path((0,)), ValueError, r"world_sizes\[0\] must be >= 1"),
        (lambda: distributed.measure_critical_path((), n=8), ValueError, "world_sizes must not be empty"),
        (lambda: distributed.measure_critical_path((2,), repeats=0), ValueError, "repeats must be >= 1, got 0"),
        (lambda: distributed.measure_critical_path((2,), n=8.0), TypeError, "n must be an int"),
        (lambda: distributed.measure_critical_path((2,), timeout=-1), ValueError, "timeout"),
    ],
)
def test_bad_arguments_are_rejected_naming_the_argument(call, error, fragment):
    with pytest.raises(error, match=fragment):
        call()
