"""How many bytes attention moves between a GPU's HBM and its chip, and what that costs: the IO model.

A step's time is at least ``max(FLOPs / peak FLOP/s, bytes / HBM bandwidth)`` (the *roofline*).
The counts here are for one (batch, head) pair and a given bytes-per-number:

* :func:`naive_forward_steps`: plain attention as three kernels, each reading its inputs from HBM
  and writing its result back (the ``N × N`` scores, then the ``N × N`` weights).
* :func:`fused_forward_step`: one FlashAttention kernel, which reads Q, K, V and writes O and the
  log-sum-exp. K and V are counted **once per head**: every query tile of a head reads the same
  K and V, but those tiles run at about the same time and one head's K and V (``2 · N · d``
  numbers, 1 MiB at N = 4096, d = 64 in float16) fit in the L2 cache (50 MB on an H100) many times
  over, so the re-reads are served by L2, not HBM.
* :func:`fused_forward_bytes`: the same kernel's HBM bytes *without* the L2 assumption, K and V
  read once per tile of ``block_q`` queries (what the kernel's loads ask for).
* :func:`training_traffic`: forward plus backward HBM traffic of the three ways of the
  FlashAttention papers: plain attention, FlashAttention-1's loop order (key tiles outside; Q, O,
  dO, dQ re-read for every key tile) and FlashAttention-2's (query tiles outside).

GPU numbers (:data:`GPUS`) are NVIDIA's datasheet figures: dense (no sparsity) FP16/BF16
tensor-core FLOP/s and HBM bandwidth.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from attn_course import _validate

__all__ = ["Gpu", "GPUS", "H100_EXP_FLOPS", "Step", "naive_forward_steps", "fused_forward_step",
           "fused_forward_bytes", "training_traffic", "step_time"]


class Gpu(NamedTuple):
    """A GPU's two roofline numbers and where they come from.

    Attributes:
        name: e.g. ``"H100 SXM"``.
        flops: dense FP16/BF16 tensor-core FLOP/s.
        hbm_bytes_per_s: HBM bandwidth in bytes per second.
        source: the document the numbers are taken from.
    """

    name: str
    flops: float
    hbm_bytes_per_s: float
    source: str

    @property
    def ridge(self) -> float:
        """FLOPs per byte above which a step is compute-bound: ``flops / hbm_bytes_per_s``."""
        return self.flops / self.hbm_bytes_per_s


GPUS = {
    "H100 SXM": Gpu("H100 SXM", 989e12, 3.35e12,
                    "NVIDIA H100 Tensor Core GPU datasheet: 989 TFLOPS dense FP16/BF16, 3.35 TB/s HBM3"),
    "H200 SXM": Gpu("H200 SXM", 989e12, 4.8e12,
                    "NVIDIA H200 Tensor Core GPU datasheet: 989 TFLOPS dense FP16/BF16, 4.8 TB/s HBM3e"),
}
#: Exponentials per second on an H100 SXM5's special-function units (FlashAttention-3 paper, §3.3).
H100_EXP_FLOPS = 3.9e12


class Step(NamedTuple):
    """One kernel of the IO model: its FLOPs and the HBM bytes it reads and writes."""

    name: str
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte of HBM traffic."""
        return self.flops / self.bytes


def naive_forward_steps(n: int, d: int, *, bytes_per_number: int = 2) -> list[Step]:
    """The three kernels of plain attention for one head, with their FLOPs and HBM bytes.

    ``S = Q Kᵀ`` reads Q, K and writes S; ``P = softmax(S)`` reads S and writes P (about 5 FLOPs
    per score: max, subtract, exp, sum, divide); ``O = P V`` reads P, V and writes O.

    Args:
        n: sequence length N (queries and keys).
        d: head dimension.
        bytes_per_number: 2 for float16/bfloat16.

    Returns:
        Three :class:`Step`.

    Raises:
        TypeError, ValueError: a size that is not an int ``>= 1``.

    Example:
        >>> [round(step.intensity, 1) for step in naive_forward_steps(4096, 64)]
        [62.1, 1.2, 62.1]
    """
    n, d, size = _validate.integers("naive_forward_steps", minimum=1, n=n, d=d, bytes_per_number=bytes_per_number)
    matrix, vectors = n * n * size, n * d * size
    return [Step("S = Q Kᵀ", 2 * n * n * d, 2 * vectors + matrix),
            Step("P = softmax(S)", 5 * n * n, 2 * matrix),
            Step("O = P V", 2 * n * n * d, matrix + 2 * vectors)]


def fused_forward_step(n: int, d: int, *, bytes_per_number: int = 2) -> Step:
    """The FlashAttention forward kernel for one head: Q, K, V read once, O and the LSE written once.

    Args:
        n, d, bytes_per_number: as in :func:`naive_forward_steps`.

    Returns:
        A :class:`Step` with ``4 N² d + 5 N²`` FLOPs and ``4 N d`` numbers plus ``N`` float32
        log-sum-exps of traffic: its intensity grows as about ``N / 2`` FLOPs per byte in float16.

    Raises:
        TypeError, ValueError: a size that is not an int ``>= 1``.

    Example:
        >>> round(fused_forward_step(4096, 64).intensity)
        2072
    """
    n, d, size = _validate.integers("fused_forward_step", minimum=1, n=n, d=d, bytes_per_number=bytes_per_number)
    return Step("fused (FlashAttention)", 4 * n * n * d + 5 * n * n, 4 * n * d * size + 4 * n)


def fused_forward_bytes(n: int, d: int, block_q: int, *, bytes_per_number: int = 2) -> int:
    """HBM bytes of the fused forward kernel for one head when every query tile reads K and V from HBM.

    One program per tile of ``block_q`` queries, ``ceil(N / block_q)`` of them: each reads its
    tile of Q and all of K and V, and writes its tile of O and one float32 log-sum-exp per row.
    So Q and O cross HBM once, K and V ``ceil(N / block_q)`` times:
    ``(2 N d + 2 N d · ceil(N / block_q)) · bytes_per_number + 4 N``. :func:`fused_forward_step`
    counts K and V once instead (L2 serves the re-reads).

    Args:
        n, d: sequence length (queries and keys) and head dimension.
        block_q: queries per tile (per program).
        bytes_per_number: 2 for float16/bfloat16.

    Returns:
        The bytes, an int.

    Raises:
        TypeError, ValueError: a size that is not an int ``>= 1``.

    Example:
        >>> fused_forward_bytes(4096, 64, 128) / 2**20     # 32 query tiles, each reading K and V: 1 MiB
        33.015625
    """
    n, d, size, block_q = _validate.integers("fused_forward_bytes", minimum=1, n=n, d=d,
                                             bytes_per_number=bytes_per_number, block_q=block_q)
    query_tiles = math.ceil(n / block_q)
    return (2 * n * d + 2 * n * d * query_tiles) * size + 4 * n   # Q, O once; K, V per tile; the LSE


def training_traffic(batch: int, heads: int, n: int, d: int, *, bytes_per_number: int = 2,
                     sram_bytes: int = 192 * 1024, mask_and_dropout: bool = False) -> dict[str, float]:
    """HBM bytes of one forward and backward pass of attention, three ways.

    * ``"naive"``: forward 4 passes over an ``N × N`` matrix (write S, read S, write P, read P),
      backward 7 (read P for dV, write dP, read P and dP, write dS, read dS for dQ and for dK);
      with ``mask_and_dropout`` (the FlashAttention paper's GPT-2 baseline) the mask and the dropout
      are separate kernels, each reading and writing the matrix forward and backward: 8 more.
    * ``"flash1"``: FlashAttention-1's loop order (its Algorithms 1 and 4). K, V are read once and
      dK, dV written once; for each of the ``T_c = ceil(N / B_c)`` key tiles, with
      ``B_c = ceil(M / (4 d))`` and ``M`` the SRAM in numbers, Q, O (and ℓ, m) are read and O
      written, and in the backward Q, O, dO, dQ read and dQ written: ``Θ(N² d² / M)`` in all.
    * ``"flash2"``: query tiles outside, K, V once per head (the L2 assumption of this module):
      forward reads Q, K, V and writes O and the LSE; backward reads Q, K, V, O, dO, the LSE and
      writes Δ, dQ, dK, dV.

    Args:
        batch, heads, n, d: B, H, N and the head dimension.
        bytes_per_number: 2 for float16/bfloat16 (statistics are float32, 4 bytes).
        sram_bytes: on-chip memory per SM for FlashAttention-1's block size (A100: 192 KB).
        mask_and_dropout: count the baseline's separate mask and dropout kernels.

    Returns:
        ``{"naive": bytes, "flash1": bytes, "flash2": bytes}``.

    Raises:
        TypeError, ValueError: a size that is not an int ``>= 1``, or ``mask_and_dropout`` not a bool.

    Example:
        >>> traffic = training_traffic(64, 16, 1024, 64, mask_and_dropout=True)   # GPT-2 medium
        >>> {name: round(value / 1e9, 1) for name, value in traffic.items()}
        {'naive': 42.4, 'flash1': 4.1, 'flash2': 1.6}
    """
    where = "training_traffic"
    n, d, size, batch, heads, sram_bytes = _validate.integers(where, minimum=1, n=n, d=d,
                                                              bytes_per_number=bytes_per_number, batch=batch,
                                                              heads=heads, sram_bytes=sram_bytes)
    mask_and_dropout = _validate.boolean(where, "mask_and_dropout", mask_and_dropout)
    matrix, vectors, row = n * n * size, n * d * size, n * 4
    passes = 4 + 7 + (8 if mask_and_dropout else 0)
    naive = passes * matrix + (4 + 8) * vectors          # Q, K, V, O forward; Q, K, V, dO, dQ, dK, dV, O back
    key_tiles = math.ceil(n / math.ceil(sram_bytes // size / (4 * d)))
    flash1 = (2 * vectors + key_tiles * (3 * vectors + 4 * row)            # forward
              + 4 * vectors + key_tiles * (5 * vectors + 2 * row))         # backward
    flash2 = (4 * vectors + row) + (8 * vectors + 3 * row)
    return {name: float(batch * heads * value) for name, value in
            (("naive", naive), ("flash1", flash1), ("flash2", flash2))}


def step_time(step: Step, gpu: Gpu) -> tuple[float, str]:
    """The roofline's lower bound on a step's time, and what bounds it.

    Args:
        step: a :class:`Step`.
        gpu: a :class:`Gpu` (e.g. ``GPUS["H100 SXM"]``).

    Returns:
        ``(seconds, "memory" or "compute")``.

    Raises:
        TypeError: ``step`` or ``gpu`` of the wrong type.

    Example:
        >>> step_time(Step("x", 989e12, 1.0), GPUS["H100 SXM"])
        (1.0, 'compute')
    """
    _validate.instance("step_time", "step", step, Step)
    _validate.instance("step_time", "gpu", gpu, Gpu)
    compute, memory = step.flops / gpu.flops, step.bytes / gpu.hbm_bytes_per_s
    return (memory, "memory") if memory > compute else (compute, "compute")
