"""Ring attention and Ulysses under ``torchrun``: the same code a cluster runs, checked against one process.

    torchrun --standalone --nproc-per-node 2 -m attn_course.distributed.torchrun_demo
    torchrun --standalone --nproc-per-node 4 -m attn_course.distributed.torchrun_demo --causal --seq-len 256
    python -m attn_course.distributed.torchrun_demo          # one process (world size 1): a smoke test

``torchrun`` starts the processes and gives each ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``; :func:`main` joins them with
``init_process_group`` (NCCL with one GPU per process where CUDA is available, gloo
otherwise). Every rank builds the same random q, k, v from one seed, keeps its shard, runs
each algorithm, and sends its output and gradient shards to the others; rank 0 puts them
back together, compares them with single-process attention and prints the largest error and
the bytes it sent next to the formula. (``--standalone`` lets torchrun pick a free port;
without it, it uses 29500 on this machine.) Without torchrun's variables, :func:`main` runs
as a group of one.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import sys

import torch
import torch.distributed as dist

from attn_course.core.attention import self_attention
from attn_course.core.masks import causal_mask
from attn_course.distributed.layout import LAYOUTS, shard, unshard
from attn_course.distributed.ring import ring_attention
from attn_course.distributed.ulysses import ulysses_attention, ulysses_bytes
from attn_course.distributed.wiretap import tap_process_group

__all__ = ["main", "TOLERANCE"]

TOLERANCE = 1e-5          # float32: the sharded computation must match one process this closely


def _join_group() -> tuple[int, int, torch.device, bool]:
    """Join torchrun's group (its environment variables), or make a group of one. Returns rank, P, device, ours."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        use_cuda = torch.cuda.is_available()
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else torch.device("cpu")
        if use_cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if use_cuda else "gloo", timeout=datetime.timedelta(seconds=120))
        return dist.get_rank(), dist.get_world_size(), device, True
    if dist.is_initialized():                          # already in a group (a notebook that made one)
        return dist.get_rank(), dist.get_world_size(), torch.device("cpu"), False
    # A group of one meets in an in-process store: no port at all.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return 0, 1, torch.device("cpu"), True


def _gather(x: torch.Tensor, world_size: int) -> list[torch.Tensor]:
    """Every rank's ``x``, in rank order (collecting the results: not part of the algorithms' traffic)."""
    parts = [torch.empty_like(x) for _ in range(world_size)]
    dist.all_gather(parts, x.contiguous())
    return parts


def _run(name: str, attend, layout: str, inputs: tuple, rank: int, world_size: int, causal: bool) -> dict:
    """Run one algorithm on this rank's shards; gather outputs and gradients; the bytes sent, read off the wire."""
    q, k, v, g = (shard(x, rank, world_size, layout) for x in inputs)              # [B, H, N/P, d]
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    with tap_process_group() as forward:
        out = attend(q, k, v, causal=causal)                                       # [B, H, N/P, d]
    with tap_process_group() as backward:
        (out * g).sum().backward()
    gathered = [unshard(_gather(x.detach(), world_size), layout) for x in (out, q.grad, k.grad, v.grad)]
    return dict(name=name, layout=layout, gathered=gathered, forward=forward.bytes_sent,
                total=forward.bytes_sent + backward.bytes_sent)


def main(argv: list[str] | None = None) -> int:
    """Run the demo on this process's rank; rank 0 prints one line per algorithm.

    Args:
        argv: e.g. ``["--seq-len", "64", "--causal"]`` (not ``--n``: torchrun
            would take that for its own ``--nnodes``) (default: ``sys.argv[1:]``).

    Returns:
        0 when every algorithm matched single-process attention within :data:`TOLERANCE`, else 1.
    """
    parser = argparse.ArgumentParser(prog="torchrun --nproc-per-node P -m attn_course.distributed.torchrun_demo",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4, help="H, divisible by P for Ulysses (default 4)")
    parser.add_argument("--seq-len", type=int, default=64, help="sequence length N, divisible by 2P (default 64)")
    parser.add_argument("--head-dim", type=int, default=16)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    rank, world_size, device, ours = _join_group()
    try:
        generator = torch.Generator().manual_seed(args.seed)                       # the same tensors on every rank
        shape = (args.batch, args.heads, args.seq_len, args.head_dim)
        inputs = tuple(torch.randn(shape, generator=generator).to(device) for _ in range(4))   # q, k, v, g
        methods = [] if args.heads % world_size else [("ulysses", ulysses_attention, "contiguous")]
        methods += [("ring", functools.partial(ring_attention, layout=layout), layout)
                    for layout in LAYOUTS]                            # contiguous, zig-zag, striped
        results = [_run(name, attend, layout, inputs, rank, world_size, args.causal)
                   for name, attend, layout in methods]
        if rank != 0:
            return 0
        q, k, v, g = (x.detach().clone().requires_grad_() for x in inputs)
        mask = causal_mask(args.seq_len, device=device) if args.causal else None
        out, _ = self_attention(q, k, v, mask)
        (out * g).sum().backward()
        expected = [out.detach(), q.grad, k.grad, v.grad]
        backend = dist.get_backend()
        print(f"# world size {world_size} ({backend}, {device}); q, k, v [B, H, N, d] = {list(shape)}, float32, "
              f"causal={args.causal}; each rank holds N/P = {args.seq_len // world_size} tokens")
        if args.heads % world_size:
            print(f"# ulysses left out: H={args.heads} heads do not divide over P={world_size} ranks (whole heads "
                  f"per rank); try --heads {world_size * max(1, args.heads // world_size)}")
        failed = False
        shard_bytes = args.batch * args.heads * (args.seq_len // world_size) * args.head_dim * 4
        for result in results:
            error_out = (result["gathered"][0] - expected[0]).abs().max().item()
            error_grad = max((got - want).abs().max().item() for got, want in zip(result["gathered"][1:], expected[1:]))
            ok = max(error_out, error_grad) <= TOLERANCE
            failed |= not ok
            if result["name"] == "ulysses":
                formula = ulysses_bytes(args.batch, args.heads, args.seq_len, args.head_dim, world_size)
                formulas = f" (formula {formula} B), forward+backward {result['total']} B (formula {2 * formula} B)"
            else:
                # K, V passed P - 1 times forward; backward: K, V P - 1 times again and dK, dV P times (home).
                formula, total = 2 * (world_size - 1) * shard_bytes, (6 * world_size - 4) * shard_bytes
                total = total if world_size > 1 else 0
                formulas = f" (formula {formula} B), forward+backward {result['total']} B (formula {total} B)"
            print(f"{result['name']:<7} {result['layout']:<10}: max |out - one process| {error_out:.1e}, "
                  f"max |grad - one process| {error_grad:.1e}  {'OK' if ok else 'FAILED'}; rank 0 sent "
                  f"forward {result['forward']} B{formulas}")
        return 1 if failed else 0
    finally:
        if ours:
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
