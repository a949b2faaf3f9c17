"""``python -m attn_course.bench NAME``: run one benchmark, print its table, write its CSV.

    python -m attn_course.bench kv-cache     # generation with and without a KV cache
    python -m attn_course.bench flash        # FlashAttention: GPU TFLOP/s, or CPU time and memory
                                             # (on a CPU also forward+backward memory, for training)

``kv-cache`` writes ``bench-results/kv-cache.csv``; ``flash`` writes ``flash-gpu.csv`` on a
CUDA machine, ``flash-cpu.csv`` and ``flash-cpu-training.csv`` elsewhere, with a PNG plot. ``--out`` changes the
folder; ``--lengths`` overrides the list of N for ``flash`` and the numbers of generated
tokens for ``kv-cache``.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch

from attn_course.bench.kv_cache import kv_cache_speedup, print_kv_cache
from attn_course.bench.timing import machine_description, write_csv


def _length(text: str) -> int:
    # argparse's type=int would let 0 or -5 through to a traceback; say it as a usage error.
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark named in ``argv`` (default: ``sys.argv[1:]``) and write its results.

    Args:
        argv: command-line arguments, e.g. ``["flash", "--lengths", "256", "512"]``.

    Returns:
        0 on success (argparse exits with status 2 on bad arguments).
    """
    parser = argparse.ArgumentParser(prog="python -m attn_course.bench", description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=["kv-cache", "flash"])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench-results"),
                        help="folder for the CSV and PNG (default: bench-results)")
    parser.add_argument("--lengths", type=_length, nargs="+",
                        help="sequence lengths N for flash; numbers of new tokens for kv-cache")
    args = parser.parse_args(argv)
    description = machine_description()
    print(f"# {description}")
    if args.name == "kv-cache":
        counts = {"new_tokens": tuple(args.lengths)} if args.lengths else {}
        rows = kv_cache_speedup(**counts, repeats=3)
        print_kv_cache(rows)
        print(f"wrote {write_csv(rows, args.out / 'kv-cache.csv')}")
        return 0

    # Imported only for flash: it loads the FlashAttention package (and Triton).
    from attn_course.bench import flash

    lengths = {"lengths": tuple(args.lengths)} if args.lengths else {}
    on_gpu = torch.cuda.is_available()
    rows = flash.gpu_rows(**lengths) if on_gpu else flash.cpu_rows(**lengths)
    flash.print_flash(rows)
    name = "flash-gpu" if on_gpu else "flash-cpu"
    print(f"wrote {write_csv(rows, args.out / f'{name}.csv')}")
    plot = args.out / f"{name}.png"
    try:
        flash.plot_rows(rows, plot, title=f"FlashAttention benchmark: {description}")
    except ImportError:   # a bare GPU image may lack matplotlib; the CSV holds the numbers
        print("matplotlib is not installed: no plot")
    else:
        print(f"wrote {plot}")
    if not on_gpu:
        training = flash.training_rows(**lengths)
        flash.print_training(training)
        print(f"wrote {write_csv(training, args.out / 'flash-cpu-training.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
