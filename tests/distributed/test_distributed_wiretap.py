"""attn_course.distributed.wiretap: bytes read off the tensors handed to torch.distributed.

Real gloo processes; the expected bytes are worked out here from the exchanges' sizes, and for the
attention algorithms the tap must agree with the count at the communication helpers (two counts, one
of which knows nothing of the algorithms), in float32 and in bfloat16 with grouped-query heads.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

from attn_course.distributed import launch
from attn_course.distributed.demo import tapped_exchanges
from attn_course.distributed.wiretap import tap_process_group
from attn_course.measure.distributed.ranks import attention_on_rank


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_the_tap_counts_each_destinations_bytes_and_names_other_collectives(world_size):
    for rank, (bytes_to, messages, other) in enumerate(launch(tapped_exchanges, world_size)):
        expected = {j: (j + 1) * 3 * 4 for j in range(world_size) if j != rank}      # uneven all-to-all rows
        if world_size > 1:
            nxt = (rank + 1) % world_size
            expected[nxt] += 5 * 2                                                  # five bfloat16 numbers
        assert bytes_to == expected
        assert messages == (world_size - 1) + (world_size > 1)
        assert other == ["all_reduce"]


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("method, dtype, kv_heads", [("ring", torch.float32, 4), ("ring", torch.bfloat16, 2),
                                                     ("ulysses", torch.float32, 12), ("ulysses", torch.bfloat16, 6)])
def test_the_tap_agrees_with_the_count_at_the_communication_helpers(world_size, method, dtype, kv_heads):
    heads, n = 12 if method == "ulysses" else 4, 12              # Ulysses: P = 2 and 3 divide H and H_kv
    generator = torch.Generator().manual_seed(world_size)
    q, g = (torch.randn(1, heads, n, 8, generator=generator).to(dtype) for _ in range(2))
    k, v = (torch.randn(1, kv_heads, n, 8, generator=generator).to(dtype) for _ in range(2))
    runs = launch(functools.partial(attention_on_rank, method=method, causal=True, grad_out=g), world_size, q, k, v)
    for r in runs:
        assert r["forward_wire_bytes"] == r["forward_bytes"] > 0
        assert r["backward_wire_bytes"] == r["backward_bytes"] > 0
        assert r["other_collectives"] == ()


def test_the_tap_restores_torch_distributed_and_does_not_nest():
    originals = dist.batch_isend_irecv, dist.all_to_all_single, dist.all_reduce
    with tap_process_group() as tap:
        assert dist.all_to_all_single is not originals[1]
        with pytest.raises(RuntimeError, match="already active"):
            with tap_process_group():
                pass
    assert (dist.batch_isend_irecv, dist.all_to_all_single, dist.all_reduce) == originals
    assert tap.bytes_sent == 0 and tap.other_calls == []
