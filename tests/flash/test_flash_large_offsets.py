"""The forward, decoding and backward kernels address rows past 2**31 elements (issue 32, hardening; issue 42).

A row's offset is its position times the row stride; in int32 it wraps once that product passes
2**31 elements: a packed ``[B, N, 3, H, d]`` QKV view past about 174k tokens, a KV cache past two
million keys. The kernels compute every offset in int64. Here q, k and v (and, for the backward,
the output and its gradient) are views into one buffer of just over 2**31 float16 elements, left
uninitialised by torch.empty, of which only the rows the kernels read are written (a few hundred
pages). Two layouts:

* ``tile_starts``: d = 16, a row stride of 2**23, 257 rows: row 256, the first of the third query
  tile, starts at 2**31 (a tile's first row past 2**31; the rows inside a tile stay below it);
* ``inside_a_tile``: d = 64, a row stride of 2**26, 33 rows: row 32, inside the first tile of every
  kernel at d = 64 (tiles of 64 and 128 rows), starts at 2**31, so the offset of a row *within* a tile
  passes 2**31 too.

The backward's three kernels (Δ, dK/dV, dQ; and the atomic-dQ dK/dV kernel) must give on those views
exactly the gradients they give on contiguous copies, as must the forward and decoding. Each case runs
in a child process: with the offsets wrapping, the interpreter reads far outside the buffer and the
process dies instead of failing.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent('''
    import torch
    from attn_course.flash.triton_mode import use_interpreter_without_gpu
    use_interpreter_without_gpu()
    from attn_course.flash.triton_attention import (attention_backward, attention_forward, decode_attention,
                                                    flash_attention)

    n, d, row_stride = LAYOUT                        # row n - 1 starts at (n - 1) * row_stride = 2**31 elements
    buffer = torch.empty((n - 1) * row_stride + 5 * d, dtype=torch.float16)
    generator = torch.Generator().manual_seed(0)
    views = [buffer.as_strided((1, 1, n, d), (n * row_stride, n * row_stride, row_stride, 1), offset)
             for offset in (0, d, 2 * d, 3 * d, 4 * d)]   # q, k, v (out, dO) interleaved in each row, as packed QKV
    for view in views:
        view.copy_(torch.randn(1, 1, n, d, generator=generator).half())
    q, k, v, out, grad_out = views
    copies = [view.clone() for view in views]          # the same numbers, contiguous
    KIND = None
    if KIND == "forward":
        far, near = flash_attention(q, k, v, causal=True), flash_attention(*copies[:3], causal=True)
    elif KIND == "backward":                            # the Δ, dK/dV and dQ kernels, then dQ by atomic adds
        _, lse = attention_forward(*copies[:3], causal=True)
        out.copy_(_)
        copies[3].copy_(_)
        far = torch.cat([torch.cat(attention_backward(grad_out, q, k, v, out, lse, causal=True, deterministic=mode))
                         for mode in (True, False)])
        near = torch.cat([torch.cat(attention_backward(copies[4], *copies[:4], lse, causal=True, deterministic=mode))
                          for mode in (True, False)])
    else:                                               # one query against the n cached keys
        far, near = decode_attention(q[:, :, -1:], k, v), decode_attention(copies[0][:, :, -1:], *copies[1:3])
    print("EQUAL" if torch.equal(far, near) else f"DIFFERENT {(far.float() - near.float()).abs().max().item()}")
''')


# (rows, d, row stride): the last row starts at exactly 2**31 elements.
LAYOUTS = {"tile_starts": (257, 16, 2**23), "inside_a_tile": (33, 64, 2**26)}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["forward", "decode", "backward"])
def test_rows_past_two_to_the_31_elements_are_read_where_they_are(kind, layout):
    n, d, row_stride = LAYOUTS[layout]
    assert (n - 1) * row_stride == 2**31
    child = CHILD.replace("KIND = None", f"KIND = {kind!r}").replace("LAYOUT", repr(LAYOUTS[layout]))
    completed = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, f"exit {completed.returncode}: {completed.stderr[-2000:]}"
    assert completed.stdout.strip().splitlines()[-1] == "EQUAL", completed.stdout
