"""Benchmarks, run as ``python -m attn_course.bench NAME``.

Speed and memory claims in the course are measured here, not asserted in timed tests.

    python -m attn_course.bench kv-cache     # generation with and without a KV cache
    python -m attn_course.bench flash        # FlashAttention: GPU TFLOP/s, or CPU time and memory

Each benchmark prints a table and writes ``bench-results/NAME.csv`` (``flash`` writes
``flash-gpu`` or ``flash-cpu``, with a PNG plot); ``--lengths`` overrides the list of N.
"""

from __future__ import annotations

import argparse
import csv
import pathlib
import platform
import sys
import time

import torch

from attn_course import _validate
from attn_course.language_model import LanguageModelConfig, TinyLanguageModel

__all__ = ["best_time", "kv_cache_speedup", "main"]


def best_time(fn, repeats: int) -> float:
    """The shortest of ``repeats`` wall-clock timings of ``fn()``, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def kv_cache_speedup(
    new_tokens: tuple[int, ...] = (32, 64, 128, 256),
    *,
    prompt_length: int = 32,
    embed_dim: int = 128,
    num_layers: int = 4,
    repeats: int = 1,
    seed: int = 0,
) -> list[dict[str, float]]:
    """Time generation with and without a :class:`~attn_course.kv_cache.KVCache`.

    Uses an untrained :class:`~attn_course.language_model.TinyLanguageModel` (speed does not
    depend on the weights), sampling from a fixed generator, and checks
    that both ways produce the same tokens.

    Args:
        new_tokens: numbers of tokens to generate, one row each.
        prompt_length: tokens before generation starts.
        embed_dim, num_layers: model size (4 heads).
        repeats: take the best of this many runs.
        seed: seeds weights, prompt and sampling.

    Returns:
        One dict per row: ``new_tokens``, ``seconds_without``, ``seconds_with``, ``speedup``.

    Raises:
        TypeError, ValueError: sizes that are not positive ints.
    """
    where = "kv_cache_speedup"
    counts = [_validate.integer(where, "new_tokens[i]", n, minimum=1) for n in new_tokens]
    prompt_length = _validate.integer(where, "prompt_length", prompt_length, minimum=1)
    repeats = _validate.integer(where, "repeats", repeats, minimum=1)
    torch.manual_seed(seed)
    config = LanguageModelConfig(vocab_size=64, max_length=prompt_length + max(counts), embed_dim=embed_dim,
                                 num_heads=4, num_layers=num_layers)
    model = TinyLanguageModel(config).eval()
    prompt = torch.randint(0, config.vocab_size, (1, prompt_length))
    rows = []
    for count in counts:
        def run(use_cache, count=count):
            return model.generate(prompt, count, use_cache=use_cache, generator=torch.Generator().manual_seed(seed))

        if not torch.equal(run(True), run(False)):
            raise RuntimeError("kv_cache_speedup: cached and uncached generation disagree")
        without, with_cache = best_time(lambda: run(False), repeats), best_time(lambda: run(True), repeats)
        rows.append({"new_tokens": count, "seconds_without": without, "seconds_with": with_cache,
                     "speedup": without / with_cache})
    return rows


def _write_csv(name: str, rows: list[dict], out: pathlib.Path) -> pathlib.Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _print_kv_cache(rows: list[dict]) -> None:
    print(f"{'new tokens':>10} {'no cache (s)':>13} {'cache (s)':>10} {'speed-up':>9}")
    for row in rows:
        print(f"{row['new_tokens']:>10} {row['seconds_without']:>13.3f} {row['seconds_with']:>10.3f} "
              f"{row['speedup']:>8.1f}x")


def _print_flash(rows: list[dict]) -> None:
    if "tflops" in rows[0]:
        print(f"{'method':>16} {'dtype':>9} {'d':>4} {'causal':>6} {'N':>6} {'mode':>17} {'TFLOP/s':>8}")
        for r in rows:
            print(f"{r['method']:>16} {r['dtype']:>9} {r['head_dim']:>4} {str(r['causal']):>6} {r['n']:>6} "
                  f"{r['mode']:>17} {r['tflops']:>8.1f}")
        return
    print(f"{'method':>6} {'N':>6} {'seconds':>9} {'peak MiB':>9} {'max diff':>9}")
    for r in rows:
        print(f"{r['method']:>6} {r['n']:>6} {r['seconds']:>9.3f} {r['peak_mib']:>9.1f} {r['max_difference']:>9.1e}")
    for n in sorted({r["n"] for r in rows}):
        peaks = {r["method"]: r["peak_mib"] for r in rows if r["n"] == n}
        if "naive" in peaks and "tiled" in peaks:
            print(f"N={n}: tiled peak memory {peaks['naive'] / peaks['tiled']:.1f}x below naive")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attn_course.bench", description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=["kv-cache", "flash"])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench-results"))
    parser.add_argument("--lengths", type=int, nargs="+", help="sequence lengths N for flash")
    args = parser.parse_args(argv)
    if args.name == "kv-cache":
        print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads")
        rows = kv_cache_speedup(repeats=3)
        _print_kv_cache(rows)
        print(f"wrote {_write_csv(args.name, rows, args.out)}")
        return 0
    from attn_course.flash import benchmark

    description = benchmark.machine_description()
    print(f"# {description}")
    lengths = {"lengths": tuple(args.lengths)} if args.lengths else {}
    on_gpu = torch.cuda.is_available()
    rows = benchmark.gpu_rows(**lengths) if on_gpu else benchmark.cpu_rows(**lengths)
    _print_flash(rows)
    name = "flash-gpu" if on_gpu else "flash-cpu"
    print(f"wrote {_write_csv(name, rows, args.out)}")
    plot = args.out / f"{name}.png"
    try:
        benchmark.plot_rows(rows, plot, title=f"FlashAttention benchmark: {description}")
    except ImportError:   # a bare GPU image may lack matplotlib; the CSV holds the numbers
        print("matplotlib is not installed: no plot")
    else:
        print(f"wrote {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
