"""attn_course.measure.distributed: ring attention vs Ulysses, bytes measured against the formulas, chapter 10's
rank program, the taps that count from outside, the input checks."""

from __future__ import annotations

import ast
import functools
import pathlib
import subprocess
import sys

import pytest
import torch

import attn_course.measure
from attn_course.core.attention import self_attention
from attn_course.core.masks import causal_mask
from attn_course.distributed import communication, launch, ring, unshard
from attn_course.distributed.schedule import METHODS, formula_bytes
from attn_course.measure import distributed
from attn_course.measure.distributed.ranks import attention_on_rank

BENCH_DIR = pathlib.Path(attn_course.measure.__file__).parent


def imported_modules(path: pathlib.Path) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) for each import statement of the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", [alias.name for alias in node.names]))
    return found


def test_distributed_imports_without_a_cycle_and_no_underscore_names():
    subprocess.run([sys.executable, "-c", "import attn_course.measure.distributed"], check=True, capture_output=True)
    found = [found for path in sorted((BENCH_DIR / "distributed").glob("*.py")) for found in imported_modules(path)]
    assert found
    for module, names in found:
        if module.startswith("attn_course") and not module.startswith("attn_course.measure.distributed"):
            assert not any(part.startswith("_") for part in module.split(".")), module
            assert all(not imported.startswith("_") or imported == "_validate" for imported in names), names


def test_distributed_measured_bytes_with_grouped_query_attention_equal_the_formulas():
    rows = distributed.measure_traffic((2, 4), n=16, n_per_rank=4, heads=8, kv_heads=4, head_dim=4)
    assert all(r.matches for r in rows) and {r.kv_heads for r in rows} == {4}
    for r in rows:
        kv_shard = 1 * 4 * r.n_local * 4 * 4                                  # B·H_kv·(N/P)·d·4
        q_shard = 2 * kv_shard
        if r.method == "ulysses":
            assert r.forward_bytes * r.world_size == (r.world_size - 1) * (2 * q_shard + 2 * kv_shard)
        else:
            assert r.forward_bytes == 2 * (r.world_size - 1) * kv_shard
    with pytest.raises(ValueError, match=r"^measure_traffic: H_kv=2 must be divisible by P=4 for ulysses"):
        distributed.measure_traffic((4,), n=16, n_per_rank=4, heads=8, kv_heads=2)
    with pytest.raises(ValueError, match=r"^measure_traffic: H=8 must be divisible by H_kv=3"):
        distributed.measure_traffic((2,), n=16, n_per_rank=4, heads=8, kv_heads=3)


def test_distributed_measured_bytes_equal_the_formulas_exactly():
    rows = distributed.measure_traffic((1, 2), n=8, n_per_rank=4, heads=2, head_dim=4)
    assert [(r.scaling, r.world_size, r.method) for r in rows] == [
        (scaling, p, m) for scaling in ("N fixed", "N ∝ P") for p in (1, 2) for m in METHODS]
    assert all(r.matches for r in rows)
    for r in rows:
        assert (r.wire_forward_bytes, r.wire_total_bytes) == (r.forward_bytes, r.total_bytes)   # tapped = counted
        sizes = (r.batch, r.heads, r.n, r.head_dim, r.world_size)
        assert (r.forward_bytes, r.total_bytes) == (formula_bytes(r.method, *sizes),
                                                    formula_bytes(r.method, *sizes, backward=True))
    shard = 1 * 2 * 4 * 4 * 4                                                # B·H·(N/P)·d·4 at N=8, P=2
    two = {r.method: (r.forward_bytes, r.total_bytes) for r in rows if r.world_size == 2 and r.scaling == "N fixed"}
    assert two == {"ulysses": (2 * shard, 4 * shard), "ring": (2 * shard, 8 * shard),
                   "ring zigzag": (2 * shard, 8 * shard), "ring striped": (2 * shard, 8 * shard)}


def test_distributed_functions_reject_bad_arguments():
    with pytest.raises(ValueError, match=r"^measure_traffic: H=3 must be divisible by P=2 for ulysses"):
        distributed.measure_traffic((2,), n=8, n_per_rank=4, heads=3)
    with pytest.raises(ValueError, match=r"^measure_rank_memory: .*N=6 must be divisible by 4 for the zigzag layout "
                                         r"over 2 ranks"):
        distributed.measure_rank_memory((2,), (6,), heads=2)
    with pytest.raises(ValueError, match=r"^measure_time: methods\[0\] must be one of .*, got 'megatron'"):
        distributed.measure_time((1,), methods=("megatron",))
    with pytest.raises(ValueError, match=r"^measure_distributed: world_sizes must not be empty"):
        distributed.measure_distributed(())
    with pytest.raises(ValueError, match=r"^measure_time: repeats must be >= 1, got 0"):
        distributed.measure_time((1,), repeats=0)
    with pytest.raises(TypeError, match=r"^measure_traffic: causal must be a bool, got int"):
        distributed.measure_traffic((1,), causal=1)
    with pytest.raises(TypeError, match=r"^plot_distributed: rows\[0\] must be TrafficRow"):
        distributed.plot_distributed([object()], [], [], "unused.png", title="")


# --- chapter 10's rank program, and the taps it reads ------------------------------------------------------

def test_attention_on_rank_brings_back_output_gradients_bytes_and_work():
    q, k, v, grad_out = (torch.randn(1, 2, 8, 4, generator=torch.Generator().manual_seed(s)) for s in range(4))
    leaf = [t.clone().requires_grad_() for t in (q, k, v)]
    reference, _ = self_attention(*leaf, causal_mask(8))
    (reference * grad_out).sum().backward()
    shard_bytes = 1 * 2 * 4 * 4 * 4                                           # B·H·(N/P)·d float32 at P = 2
    for method, layout in [("ring", "zigzag"), ("ulysses", "contiguous")]:
        runs = launch(functools.partial(attention_on_rank, method=method, causal=True, layout=layout,
                                        grad_out=grad_out), 2, q, k, v)
        assert torch.allclose(unshard([r["out"] for r in runs], layout), reference, atol=1e-5)
        for i in range(3):
            assert torch.allclose(unshard([r["grads"][i] for r in runs], layout), leaf[i].grad, atol=1e-5)
        # ring: K, V one hop forward; K, V one hop and dK, dV two hops backward. Ulysses: half of 4 shards each way.
        forward, backward = (2 * shard_bytes, 6 * shard_bytes) if method == "ring" else (2 * shard_bytes,) * 2
        for r in runs:
            assert (r["forward_bytes"], r["backward_bytes"]) == (forward, backward)
            assert (r["forward_wire_bytes"], r["backward_wire_bytes"]) == (forward, backward)
            assert r["other_collectives"] == ()
        assert [r["work"] for r in runs] == ([5, 5] if method == "ring" else [None, None])   # 2P + 1 chunk pairs


def test_attention_on_rank_checks_its_options_before_any_communication():
    x = torch.zeros(1, 2, 4, 2)
    with pytest.raises(ValueError, match="method must be one of"):
        attention_on_rank(0, 1, x, x, x, method="tree")
    with pytest.raises(ValueError, match="Ulysses takes the contiguous layout"):
        attention_on_rank(0, 1, x, x, x, method="ulysses", layout="zigzag")


def test_the_taps_wrap_only_inside_their_block_nest_and_restore():
    originals = (communication.pass_around_ring, communication.all_to_all, ring.attend_to_block,
                 ring.block_gradients)
    with distributed.count_traffic() as outer, distributed.count_ring_work() as work:
        assert communication.pass_around_ring is not originals[0] and ring.attend_to_block is not originals[2]
        with distributed.count_traffic() as inner:
            assert communication.pass_around_ring is not originals[0]
    assert (communication.pass_around_ring, communication.all_to_all, ring.attend_to_block,
            ring.block_gradients) == originals
    assert outer.bytes_sent == inner.bytes_sent == 0 and work == distributed.RingWork()


def test_the_ring_work_tap_reads_the_pairs_it_is_given():
    """One step's pairs, by hand: a visible 2 × 3 tile, a masked 2 × 2 one and a hidden one; no process group."""
    mask = torch.tensor([[True, False], [True, True]])
    pairs = [ring.ChunkPair(slice(0, 2), slice(0, 3), None), ring.ChunkPair(slice(2, 4), slice(3, 5), mask),
             ring.ChunkPair(slice(0, 2), slice(3, 5), None, hidden=True)]
    q, k, v = torch.randn(1, 1, 4, 2), torch.randn(1, 1, 5, 2), torch.randn(1, 1, 5, 2)
    with distributed.count_ring_work() as work:
        tiles = list(ring.attend_to_block(q, k, v, pairs, 1.0, torch.float32))
        ring.block_gradients(q, k, v, pairs, 1.0, torch.ones(1, 1, 4, 2), torch.zeros(1, 1, 4), torch.zeros(1, 1, 4),
                             torch.zeros(1, 1, 4, 2))
    assert [rows for rows, _, _ in tiles] == [pair.rows for pair in pairs[:2]]        # the hidden pair: skipped
    assert (work.forward, work.masked, work.skipped, work.backward) == (2, 1, 1, 2)
    assert work.forward_scores_by_step == [2 * 3 + 2 * 2] and len(work.forward_seconds_by_step) == 1
