"""attn_course.measure.distributed: ring attention vs Ulysses, bytes against the formulas, the input checks."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

import attn_course.measure
from attn_course.measure import distributed

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


def test_distributed_formulas_by_hand():
    b, h, n, d = 2, 8, 64, 16
    for p in (2, 4, 8):
        shard = b * h * (n // p) * d * 4                                  # one float32 [B, H, N/P, d] shard
        assert distributed.formula_bytes("ring", b, h, n, d, p) == 2 * (p - 1) * shard
        assert distributed.formula_bytes("ring zigzag", b, h, n, d, p, backward=True) == (
            2 * (p - 1) + 2 * (p - 1) + 2 * p) * shard                     # K, V forward; K, V and dK, dV backward
        assert distributed.formula_bytes("ulysses", b, h, n, d, p) * p == 4 * (p - 1) * shard
        assert distributed.formula_bytes("ulysses", b, h, n, d, p, backward=True) * p == 8 * (p - 1) * shard
        ratio = distributed.formula_bytes("ring", b, h, n, d, p) / distributed.formula_bytes("ulysses", b, h, n, d, p)
        assert ratio == p / 2
        assert distributed.formula_bytes("ring striped", b, h, n, d, p, backward=True) == (6 * p - 4) * shard
    assert [distributed.formula_bytes(m, b, h, n, d, 1, backward=True) for m in distributed.METHODS] == [0] * 4
    # N and P grown together: Ulysses' bytes per rank approach a constant, ring's grow with P.
    ulysses = [distributed.formula_bytes("ulysses", 1, 8, 16 * p, 16, p) for p in (2, 4, 8)]
    ring = [distributed.formula_bytes("ring", 1, 8, 16 * p, 16, p) for p in (2, 4, 8)]
    assert ulysses == [16384, 24576, 28672] and ring == [16384, 49152, 114688]   # shard: 8192 B


def test_distributed_formulas_with_grouped_query_attention_and_half_precision_by_hand():
    b, h, h_kv, n, d = 1, 32, 8, 64, 16                                  # Llama 3's 32 query heads, 8 K/V heads
    for p in (2, 4, 8):
        q_shard, kv_shard = (b * heads * (n // p) * d for heads in (h, h_kv))     # elements
        ring = distributed.formula_bytes("ring", b, h, n, d, p, kv_heads=h_kv)
        ulysses = distributed.formula_bytes("ulysses", b, h, n, d, p, kv_heads=h_kv)
        assert ring == 2 * (p - 1) * kv_shard * 4
        assert ulysses * p == (p - 1) * (2 * q_shard + 2 * kv_shard) * 4
        assert ring / ulysses == p * h_kv / (h + h_kv) == p / 5         # ring sends less only for P < 5
        # bfloat16: K/V at 2 bytes, the dK/dV sums (2P hops) at float32's 4
        assert distributed.formula_bytes("ring", b, h, n, d, p, kv_heads=h_kv, element_size=2, backward=True) == (
            4 * (p - 1) * kv_shard * 2 + 2 * p * kv_shard * 4)
        assert distributed.formula_bytes("ulysses", b, h, n, d, p, kv_heads=h_kv, element_size=2,
                                         backward=True) * p == 2 * (p - 1) * (2 * q_shard + 2 * kv_shard) * 2


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
        (scaling, p, m) for scaling in ("N fixed", "N ∝ P") for p in (1, 2) for m in distributed.METHODS]
    assert all(r.matches for r in rows)
    for r in rows:
        assert (r.wire_forward_bytes, r.wire_total_bytes) == (r.forward_bytes, r.total_bytes)   # tapped = counted
        sizes = (r.batch, r.heads, r.n, r.head_dim, r.world_size)
        assert (r.forward_bytes, r.total_bytes) == (distributed.formula_bytes(r.method, *sizes),
                                                    distributed.formula_bytes(r.method, *sizes, backward=True))
    shard = 1 * 2 * 4 * 4 * 4                                                # B·H·(N/P)·d·4 at N=8, P=2
    two = {r.method: (r.forward_bytes, r.total_bytes) for r in rows if r.world_size == 2 and r.scaling == "N fixed"}
    assert two == {"ulysses": (2 * shard, 4 * shard), "ring": (2 * shard, 8 * shard),
                   "ring zigzag": (2 * shard, 8 * shard), "ring striped": (2 * shard, 8 * shard)}


def test_distributed_functions_reject_bad_arguments():
    with pytest.raises(ValueError, match=r"^measure_traffic: H=3 must be divisible by P=2 for ulysses"):
        distributed.measure_traffic((2,), n=8, n_per_rank=4, heads=3)
    with pytest.raises(ValueError, match=r"^measure_rank_memory: N=6 must be divisible by 4 for ring zigzag over P=2"):
        distributed.measure_rank_memory((2,), (6,), heads=2)
    with pytest.raises(ValueError, match=r"^measure_time: methods\[0\] must be one of .*, got 'megatron'"):
        distributed.measure_time((1,), methods=("megatron",))
    with pytest.raises(ValueError, match=r"^measure_distributed: world_sizes must not be empty"):
        distributed.measure_distributed(())
    with pytest.raises(ValueError, match=r"^measure_time: repeats must be >= 1, got 0"):
        distributed.measure_time((1,), repeats=0)
    with pytest.raises(TypeError, match=r"^measure_traffic: causal must be a bool, got int"):
        distributed.measure_traffic((1,), causal=1)
    with pytest.raises(ValueError, match=r"^formula_bytes: n=6 must be divisible by 4 for ring zigzag over 2 ranks"):
        distributed.formula_bytes("ring zigzag", 1, 2, 6, 4, 2)
    with pytest.raises(TypeError, match=r"^print_traffic: rows\[0\] must be TrafficRow"):
        distributed.print_traffic([object()])
