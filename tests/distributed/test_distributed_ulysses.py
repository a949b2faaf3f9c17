"""attn_course.distributed.ulysses: outputs, gradients and bytes against one process, and the torchrun demo.

Every configuration of one ``P`` runs in a single launch (:func:`ulysses_rank` loops over them),
so the file costs a few launches. Each rank's shards are gathered and compared with the
course's single-process ``self_attention`` and its autograd gradients.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch

from attn_course.core.attention import self_attention
from attn_course.core.masks import causal_mask
from attn_course.distributed import launch, shard, unshard
from attn_course.distributed.torchrun_demo import main as demo_main
from attn_course.distributed.ulysses import ulysses_attention, ulysses_bytes
from attn_course.measure.distributed.taps import count_traffic

REPO = pathlib.Path(__file__).resolve().parents[2]
# (B, H, N, d, causal, H_kv): H_kv divisible by every P below where it is run, and dividing H; N by P.
# H_kv < H is grouped-query attention (H_kv = 1 with H = 4 at P = 1 would be multi-query).
CONFIGS = {
    2: [(1, 2, 8, 4, False, 2), (2, 4, 12, 8, True, 4), (1, 4, 16, 4, False, 4), (1, 2, 6, 8, True, 2),
        (1, 8, 8, 4, True, 2), (2, 6, 12, 4, False, 2)],
    3: [(1, 6, 9, 4, False, 6), (2, 6, 12, 8, True, 6), (1, 3, 6, 4, True, 3), (1, 12, 6, 4, True, 3)],
    4: [(1, 4, 8, 4, False, 4), (2, 8, 16, 8, True, 8), (1, 4, 4, 4, True, 4), (1, 16, 8, 4, True, 4)],
}
# A head count that P does not divide, tried on every rank of each launch; and a K/V head count.
BAD_HEADS = {2: 3, 3: 4, 4: 6}
BAD_KV_HEADS = {2: (6, 3), 3: (8, 4), 4: (12, 6)}


def full_inputs(config: tuple) -> tuple[torch.Tensor, ...]:
    """The same q, k, v and output gradient g on every rank and in the test, seeded: q and g
    ``[B, H, N, d]``, k and v ``[B, H_kv, N, d]``."""
    b, h, n, d, _, h_kv = config
    generator = torch.Generator().manual_seed(hash(config) % 2**31)
    return tuple(torch.randn(b, heads, n, d, generator=generator) for heads in (h, h_kv, h_kv, h))


def ulysses_rank(rank: int, world_size: int, configs: list, bad_heads: int) -> dict:
    """On one rank: every config's output and gradient shards and its bytes, and the message for a bad H."""
    results = []
    for config in configs:
        q, k, v, g = (shard(x, rank, world_size) for x in full_inputs(config))     # [B, H, N/P, d]
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        with count_traffic() as forward:
            out = ulysses_attention(q, k, v, causal=config[4])                         # [B, H, N/P, d]
        with count_traffic() as backward:
            (out * g).sum().backward()
        results.append(dict(out=out.detach(), grads=[x.grad for x in (q, k, v)],
                            forward=forward.bytes_sent, backward=backward.bytes_sent))
    messages = []
    for heads, kv_heads in ((bad_heads, bad_heads), BAD_KV_HEADS[world_size]):
        try:
            ulysses_attention(torch.zeros(1, heads, world_size, 4), *[torch.zeros(1, kv_heads, world_size, 4)] * 2)
            messages.append(None)
        except ValueError as error:
            messages.append(str(error))
    return dict(results=results, bad_heads_message=messages[0], bad_kv_heads_message=messages[1])


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def launched(request):
    world_size = request.param
    return world_size, launch(ulysses_rank, world_size, CONFIGS[world_size], BAD_HEADS[world_size], timeout=120)


def reference(config: tuple) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Single-process attention on the full sequence: output and the gradients of (out · g).sum().
    The course's self_attention, or PyTorch's SDPA with ``enable_gqa`` when H_kv < H."""
    q, k, v, g = full_inputs(config)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    if config[5] == config[1]:
        mask = causal_mask(q.shape[2]) if config[4] else None
        out, _ = self_attention(q, k, v, mask)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=config[4], enable_gqa=True)
    (out * g).sum().backward()
    return out.detach(), [x.grad for x in (q, k, v)]


def test_outputs_and_gradients_equal_single_process_attention(launched):
    world_size, ranks = launched
    for index, config in enumerate(CONFIGS[world_size]):
        expected_out, expected_grads = reference(config)
        out = unshard([r["results"][index]["out"] for r in ranks])                     # [B, H, N, d]
        assert (out - expected_out).abs().max() < 1e-5, (world_size, config)
        for which in range(3):                                                         # dq, dk, dv
            grad = unshard([r["results"][index]["grads"][which] for r in ranks])
            assert (grad - expected_grads[which]).abs().max() < 1e-5, (world_size, config, "qkv"[which])


def test_every_rank_sends_four_all_to_alls_of_its_shard_forward_and_four_backward(launched):
    world_size, ranks = launched
    for index, (b, h, n, d, _, h_kv) in enumerate(CONFIGS[world_size]):
        q_bytes, kv_bytes = (b * heads * (n // world_size) * d * 4 for heads in (h, h_kv))     # float32 shards
        forward = (world_size - 1) * (2 * q_bytes + 2 * kv_bytes) // world_size         # written out here
        assert ulysses_bytes(b, h, n, d, world_size, kv_heads=h_kv) == forward
        assert ulysses_bytes(b, h, n, d, world_size, backward=True, kv_heads=h_kv) == 2 * forward
        if h_kv == h:
            assert ulysses_bytes(b, h, n, d, world_size) == 4 * (world_size - 1) * q_bytes // world_size
        for rank in ranks:
            measured = rank["results"][index]
            assert (measured["forward"], measured["backward"]) == (forward, forward), (world_size, (b, h, n, d))


def test_heads_not_divisible_by_the_ranks_are_refused_by_name(launched):
    world_size, ranks = launched
    for rank in ranks:
        assert rank["bad_heads_message"] == (
            f"ulysses_attention: the number of heads H={BAD_HEADS[world_size]} must be divisible by the number of "
            f"ranks P={world_size}: Ulysses gives each rank H/P whole heads (use P <= H, a divisor of H, or ring "
            f"attention, which has no such limit)")
        heads, kv_heads = BAD_KV_HEADS[world_size]
        assert rank["bad_kv_heads_message"] == (
            f"ulysses_attention: the number of K/V heads H_kv={kv_heads} must be divisible by the number of "
            f"ranks P={world_size}: Ulysses gives each rank H_kv/P whole heads (use P <= H_kv, a divisor of H_kv, "
            f"or ring attention, which has no such limit)")


def test_without_a_process_group_ulysses_says_how_to_get_one():
    x = torch.zeros(1, 2, 4, 4)
    with pytest.raises(RuntimeError, match=r"^ulysses_attention: no process group: run inside"):
        ulysses_attention(x, x, x)


def test_bad_inputs_are_refused_before_any_communication():
    x = torch.zeros(1, 2, 4, 4)
    with pytest.raises(ValueError, match=r"^ulysses_attention: q must be 4-D"):
        ulysses_attention(torch.zeros(2, 4, 4), x, x)
    with pytest.raises(TypeError, match=r"^ulysses_attention: causal must be a bool, got int"):
        ulysses_attention(x, x, x, causal=1)
    with pytest.raises(ValueError, match=r"^ulysses_attention: q must be \[B, H, N_local, d\].*cut from the sequence"):
        ulysses_attention(x, torch.zeros(1, 2, 8, 4), torch.zeros(1, 2, 8, 4))
    with pytest.raises(ValueError, match=r"^ulysses_attention: grouped-query attention needs H divisible by H_kv"):
        ulysses_attention(torch.zeros(1, 3, 4, 4), x, x)
    with pytest.raises(ValueError, match=r"^ulysses_bytes: heads=4 must be divisible by kv_heads=3"):
        ulysses_bytes(1, 4, 8, 4, 2, kv_heads=3)
    with pytest.raises(ValueError, match=r"^ulysses_bytes: heads=3 must be divisible by world_size=2"):
        ulysses_bytes(1, 3, 8, 4, 2)
    with pytest.raises(ValueError, match=r"^ulysses_bytes: n=9 must be divisible by world_size=2"):
        ulysses_bytes(1, 2, 9, 4, 2)


# --- the torchrun demo ------------------------------------------------------------------------------

def test_demo_runs_as_one_process_without_torchrun(capsys):
    assert demo_main(["--seq-len", "8", "--heads", "2", "--head-dim", "4"]) == 0
    out = capsys.readouterr().out
    assert "world size 1" in out and "ulysses" in out and "OK" in out and "FAILED" not in out
    for line in out.splitlines():
        if line.startswith(("ulysses", "ring")):                  # one rank sends nothing, and says so
            assert "forward 0 B (formula 0 B), forward+backward 0 B (formula 0 B)" in line, line
    assert not torch.distributed.is_initialized()                  # the demo's own group is gone again


@pytest.mark.slow
def test_demo_under_torchrun_with_two_ranks_matches_one_process():
    torchrun = shutil.which("torchrun", path=str(pathlib.Path(sys.executable).parent)) or shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun is not installed")
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    # --standalone: a rendezvous on a free port, so parallel test runs do not collide on 29500.
    result = subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "attn_course.distributed.torchrun_demo",
         "--seq-len", "16", "--heads", "4", "--head-dim", "8", "--causal"],
        cwd=REPO, env=environment, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("ulysses")]
    assert len(lines) == 1, result.stdout                          # printed by rank 0 only
    assert "world size 2" in result.stdout and "OK" in lines[0] and "FAILED" not in result.stdout
    # B=1, H=4, N=16, d=8 float32: a shard of 4 · 8 · 8 · 4 = 1024 B, of which 4 · (P-1)/P go out forward.
    assert f"forward {ulysses_bytes(1, 4, 16, 8, 2)} B (formula {ulysses_bytes(1, 4, 16, 8, 2)} B)" in lines[0]
    for line in result.stdout.splitlines():
        if line.startswith("ring"):                                # 2(P-1) shards forward, (6P-4) in all
            assert "forward 2048 B (formula 2048 B), forward+backward 8192 B (formula 8192 B)" in line, line
