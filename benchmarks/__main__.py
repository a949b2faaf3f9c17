"""``python -m benchmarks NAME``: run one benchmark, print its table, write its CSV (and plots) to ``--out``.

    python -m benchmarks kv-cache      # generation with and without a KV cache
    python -m benchmarks flash         # GPU: benchmarks.flash_gpu; CPU: time and memory, forward and backward
    python -m benchmarks flash --dry-run   # the GPU code path on the CPU (--profile long: the whole sweep;
                                           # --max-minutes 4.5: the GPU run, bounded in time)
    python -m benchmarks variants      # attn_course.measure.variants (--quick: tiny sizes)
    python -m benchmarks sparse        # attn_course.measure.sparse_timing: top-k and MoBA against dense (--quick),
                                       # with the scores each computes and chapter 13's retrieval accuracy
    python -m benchmarks distributed   # attn_course.measure.distributed, P = 1, 2, 4 processes (--quick)
    python -m benchmarks grading --autograders dist/autograder   # benchmarks.grading (--quick: overhead only)
    python -m benchmarks serving       # attn_course.measure.serving: the engine against Hugging Face's generate
                                       # (--quick: 4 small requests, without generate_batch)

Files go to ``bench-results/``; ``--lengths`` sets the N values (for ``kv-cache`` the numbers of generated
tokens); ``--help`` lists the rest.
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import sys

import torch

from attn_course.measure.kv_cache import kv_cache_speedup
from attn_course.measure.rows import write_csv
from attn_course.measure.timing import machine_description
from attn_course.teaching.tables import table


def _show(rows, path: pathlib.Path, **shown) -> None:
    """Print ``rows`` as the chapters show a table (:func:`~attn_course.teaching.tables.table`), write their CSV."""
    print(table(rows, **shown).to_string())
    print(f"wrote {write_csv(rows, path)}")


def _memory_saving(rows, what: str) -> None:
    """One line per N: how many times less peak memory tiled attention needs than naive attention."""
    peaks = {(row.method, row.n): row.peak_mib for row in rows}
    for n in dict.fromkeys(row.n for row in rows):
        if ("naive", n) in peaks and ("tiled", n) in peaks:
            naive, tiled = peaks["naive", n], peaks["tiled", n]
            print(f"N={n}: {what} peak memory {naive / tiled:.1f}x below naive "
                  f"({naive:.1f} MiB against {tiled:.1f} MiB)")


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
        0 on success, also when ``--max-minutes`` left measurements out (their rows say so);
        1 when the GPU run was terminated (SIGTERM) before its end. argparse exits with
        status 2 on bad arguments.
    """
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=["kv-cache", "flash", "variants", "sparse", "distributed", "grading",
                                                 "serving"])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench-results"),
                        help="folder for the CSV and PNG (default: bench-results)")
    parser.add_argument("--lengths", type=_length, nargs="+",
                        help="sequence lengths N for flash, variants and sparse; numbers of new tokens for kv-cache")
    parser.add_argument("--max-minutes", type=float, default=None,
                        help="flash on a GPU: start no new measurement after this many minutes (default: no limit)")
    parser.add_argument("--profile", choices=["essential", "long"], default=None,
                        help="flash on a GPU (or --dry-run): essential (default: the first-contact check's rows, "
                             "most important first) or long (the whole sweep)")
    parser.add_argument("--dry-run", action="store_true",
                        help="flash: run the GPU benchmark's code on the CPU at tiny sizes (Triton's interpreter)")
    parser.add_argument("--quick", action="store_true",
                        help="variants, sparse and distributed: tiny sizes and one timing each")
    parser.add_argument("--threads", type=_length, default=None,
                        help="variants and sparse: CPU threads for torch while measuring (default: 1, the steadiest "
                             "timings)")
    parser.add_argument("--autograders", type=pathlib.Path, default=None,
                        help="grading: the autograders of `make assignments` (dist/autograder) to grade a class with")
    parser.add_argument("--students", type=_length, default=2, help="grading: students in the measured class")
    parser.add_argument("--jobs", type=_length, default=os.cpu_count() or 1,
                        help="grading: notebooks graded at once (default: one per core)")
    args = parser.parse_args(argv)
    if args.name != "flash" and (args.dry_run or args.max_minutes is not None or args.profile is not None):
        parser.error("--dry-run, --max-minutes and --profile are options of flash")
    if args.max_minutes is not None and not 0 < args.max_minutes < float("inf"):
        parser.error(f"--max-minutes must be a positive number of minutes, got {args.max_minutes:g}")
    if args.name == "distributed" and args.threads is not None:
        parser.error("--threads is an option of variants and sparse (distributed runs one thread per process)")
    if args.name not in ("variants", "sparse", "distributed", "grading", "serving") and (
            args.quick or args.threads is not None):
        parser.error("--quick and --threads are options of variants, sparse and serving (--quick also of distributed "
                     "and grading)")
    if args.name == "grading" and args.threads is not None:
        parser.error("--threads is an option of variants and sparse (grading shares the cores out between its jobs)")
    if args.dry_run and "triton" not in sys.modules:   # before machine_description imports Triton:
        os.environ["TRITON_INTERPRET"] = "1"           # the dry run's kernels run in the interpreter, GPU or not
    description = machine_description()
    print(f"# {description}")
    if args.name == "kv-cache":
        counts = {"new_tokens": tuple(args.lengths)} if args.lengths else {}
        _show(kv_cache_speedup(**counts), args.out / "kv-cache.csv", digits=3,
              columns={"new_tokens": "new tokens", "positions_without": "positions: no cache",
                       "positions_with": "cache", "seconds_without": "time: no cache (s)", "seconds_with": "cache (s)",
                       "speedup": "speed-up"})
        return 0
    if args.name == "variants":
        return _variants(args, description)
    if args.name == "sparse":
        return _sparse(args, description)
    if args.name == "distributed":
        return _distributed(args, description)
    if args.name == "grading":
        return _grading(args)
    if args.name == "serving":
        return _serving(args)

    # Imported only for flash: it loads the FlashAttention package (and Triton).
    from attn_course.measure import flash

    lengths = {"lengths": tuple(args.lengths)} if args.lengths else {}
    if args.dry_run or torch.cuda.is_available():
        from benchmarks import flash_gpu

        result = flash_gpu.run_gpu_benchmark(args.out, profile=args.profile or "essential", dry_run=args.dry_run,
                                             max_minutes=args.max_minutes,
                                             progress=functools.partial(print, flush=True), **lengths)
        return 1 if result.stopped == "SIGTERM" else 0
    rows = flash.cpu_rows(**lengths)
    _show(rows, args.out / "flash-cpu.csv", digits={"seconds": 3, "peak_mib": 1})
    _memory_saving(rows, "tiled")
    plot = args.out / "flash-cpu.png"
    try:
        flash.plot_rows(rows, plot, title=f"FlashAttention benchmark: {description}")
    except ImportError:   # a bare GPU image may lack matplotlib; the CSV holds the numbers
        print("matplotlib is not installed: no plot")
    else:
        print(f"wrote {plot}")
    training = flash.training_rows(**lengths)
    print("# forward + backward")
    _show(training, args.out / "flash-cpu-training.csv", digits={"seconds": 3, "peak_mib": 1})
    _memory_saving(training, "forward+backward")
    return 0


def _serving(args: argparse.Namespace) -> int:
    """``serving``: useful tokens per second of the engine and of Hugging Face's generate, then the cache's memory."""
    from attn_course.measure.serving import measure_serving

    sizes = dict(requests=4, hidden_size=32, num_layers=2, vocab_size=64, repeats=1, generate_batch=False) \
        if args.quick else {}
    threads = args.threads or 2
    print(f"# a random Llama, float32, greedy, {threads} thread(s); prompts of 3-64 tokens, 4-64 new tokens each")
    rows, memory = measure_serving(threads=threads, **sizes)
    _show(rows, args.out / "serving.csv", digits={"seconds": 3, "tokens_per_second": 0})
    _show([memory], args.out / "serving-memory.csv", digits={"prefix_hit_rate": 3})
    return 0


def _variants(args: argparse.Namespace, description: str) -> int:
    """``variants``: measure, print and write the rows, the crossovers, the cache bytes and the plot."""
    from attn_course.measure import crossover, variants
    from attn_course.variants.kv_cache_size import cache_bytes_rows

    default = variants.QUICK_LENGTHS if args.quick else variants.DEFAULT_LENGTHS
    lengths = tuple(args.lengths) if args.lengths else default
    sizes = dict(heads=2, head_dim=16, window=16, chunk_size=16, repeats=1, budget_s=0) if args.quick else {}
    threads = args.threads or 1
    shape = "B=1, H=2, d=16, window W=16, chunk C=16" if args.quick else "B=1, H=4, d=64, window W=128, chunk C=128"
    print(f"# measured on {threads} thread(s); {shape}; float32, causal")
    rows = variants.measure_variants(lengths, threads=threads, **sizes)
    _show(rows, args.out / "variants.csv", digits={"seconds": 6})
    if len(set(lengths)) >= 2:
        crossovers = [crossover.crossover_from_rows(rows, softmax=softmax)
                      for softmax in ("softmax sdpa", "softmax self_attention")]
        for found in crossovers:
            print(found.describe())
        print(f"wrote {write_csv(crossovers, args.out / 'variants-crossover.csv')}")
    else:
        print("one N only: no crossover")
    print("# KV cache per sequence, one layer, 16-bit: n_h=8, d_h=64, GQA n_kv=2, MLA d_c=256 d_h^R=32, W=4096")
    _show(cache_bytes_rows(), args.out / "variants-cache-bytes.csv", digits=1)
    plot = args.out / "variants.png"
    try:
        variants.plot_variants(rows, plot, title=f"Causal attention variants ({threads} thread(s)): {description}")
    except ImportError:   # the CSV holds the numbers
        print("matplotlib is not installed: no plot")
    else:
        print(f"wrote {plot}")
    return 0


def _sparse(args: argparse.Namespace, description: str) -> int:
    """``sparse``: scores counted, retrieval accuracy, then top-k and MoBA timed against dense attention."""
    from attn_course.measure import sparse_retrieval, sparse_timing
    from attn_course.variants.sparse_score_counts import score_count_rows

    print("# query-key scores per sequence, one layer: DeepSeek-V3.2's sizes (128 heads of d_k=192; indexer 64 "
          "heads of 128, k=2048), MoBA B=512, 3 blocks")
    _show(score_count_rows(), args.out / "sparse-score-counts.csv", digits={"of dense": 3},
          columns={"scheme": "scheme", "n": "N", "selection_scores": "selection scores",
                   "attention_scores": "attention scores", "multiply_adds": "multiply-adds", "of_dense": "of dense"})
    retrieval = (dict(n=128, head_dim=16, ks=(1, 4, 16), block_size=16, top_blocks=(1, 3), seeds=(0,))
                 if args.quick else {})
    print("# retrieval with no training: does the attention output decode to the needle's value? (seeds averaged)")
    _show(sparse_retrieval.retrieval_accuracy(**retrieval), args.out / "sparse-retrieval.csv", digits=3,
          columns={"selection": "selection", "budget": "k or blocks", "keys_read": "keys read",
                   "needle_kept": "needle kept", "accuracy": "accuracy"})
    default = sparse_timing.QUICK_LENGTHS if args.quick else sparse_timing.DEFAULT_LENGTHS
    lengths = tuple(args.lengths) if args.lengths else default
    sizes = (dict(heads=2, head_dim=16, top_k=16, block_size=16, top_blocks=1, indexer_dim=4, repeats=1, budget_s=0)
             if args.quick else {})
    threads = args.threads or 1
    shape = ("B=1, H=2, d=16, k=16, MoBA B=16 top 1, indexer 2 heads of 4" if args.quick else
             "B=1, H=2, d=64, k=256, MoBA B=64 top 3, indexer 2 heads of 16")
    print(f"# measured on {threads} thread(s); {shape}; float32, causal")
    rows = sparse_timing.measure_sparse(lengths, threads=threads, **sizes)
    _show(rows, args.out / "sparse.csv", digits={"seconds": 6})
    if len(set(lengths)) >= 2:
        crossovers = [sparse_timing.sparse_crossover(rows, name) for name in sparse_timing.SPARSE_VARIANTS[1:]]
        for found in crossovers:
            print(found.describe())
        print(f"wrote {write_csv(crossovers, args.out / 'sparse-crossover.csv')}")
    else:
        print("one N only: no crossover")
    plot = args.out / "sparse.png"
    try:
        sparse_timing.plot_sparse(rows, plot, title=f"Sparse attention ({threads} thread(s)): {description}")
    except ImportError:   # the CSV holds the numbers
        print("matplotlib is not installed: no plot")
    else:
        print(f"wrote {plot}")
    return 0


def _grading(args: argparse.Namespace) -> int:
    """``grading``: the sandbox's start-up cost, and (with ``--autograders``) a class's throughput."""
    from benchmarks import grading

    overhead = grading.sandbox_overhead(repeats=2 if args.quick else 10)
    print("# start-up of a one-cell notebook, seconds (Python, torch, IPython; with bubblewrap's sandbox or not)")
    _show(overhead, args.out / "grading-overhead.csv")
    if args.quick or args.autograders is None:
        return 0
    per_chapter, whole = grading.class_throughput(args.autograders, students=args.students, jobs=args.jobs)
    print(f"# {args.students} students x {len(per_chapter)} chapters (solution notebooks), {args.jobs} at once, "
          f"each sandboxed, {os.cpu_count()} CPU cores")
    _show(per_chapter, args.out / "grading-chapters.csv")
    _show([whole], args.out / "grading-class.csv")
    return 0


def _distributed(args: argparse.Namespace, description: str) -> int:
    """``distributed``: bytes, memory and time of ring attention and Ulysses on P = 1, 2, 4 processes."""
    from attn_course.measure import distributed

    if args.quick:
        sizes = dict(n=32, n_per_rank=8, lengths=(32, 64), time_n=32, heads=4, head_dim=8, repeats=1)
    else:
        sizes = dict(n=256, n_per_rank=64, lengths=(256, 512, 1024), time_n=1024, heads=8, head_dim=16, repeats=3)
    if args.lengths:
        sizes["lengths"] = tuple(args.lengths)
    world_sizes = (1, 2, 4)
    print(f"# P = {', '.join(map(str, world_sizes))} processes (gloo), one thread each, on {os.cpu_count()} "
          f"CPU cores; B=1, H={sizes['heads']}, d={sizes['head_dim']}, float32, causal")
    traffic, memory, timing = distributed.measure_distributed(world_sizes, **sizes)
    print(f"# bytes sent per rank, one layer: N fixed at {sizes['n']}, and N = {sizes['n_per_rank']}·P")
    bytes_columns = {"method": "method", "scaling": "sweep", "world_size": "P", "n": "N", "kv_heads": "H_kv",
                     "forward_bytes": "fwd B", "wire_forward_bytes": "fwd tapped", "forward_formula": "fwd formula",
                     "total_bytes": "fwd+bwd B", "wire_total_bytes": "fwd+bwd tapped",
                     "total_formula": "fwd+bwd formula", "matches": "exact"}
    _show(traffic, args.out / "distributed-traffic.csv", columns=bytes_columns)
    # Grouped-query attention as Llama 3 has it (4 query heads per K/V head): the ring passes only the
    # K/V heads, Ulysses moves q and the output at every head, so ring/Ulysses = P·H_kv/(H + H_kv) = P/5.
    grouped = distributed.measure_traffic(world_sizes, n=sizes["n"], n_per_rank=sizes["n_per_rank"], heads=16,
                                          kv_heads=4, head_dim=sizes["head_dim"])
    print("# bytes sent per rank with grouped-query attention, H=16 query heads, H_kv=4 K/V heads")
    _show(grouped, args.out / "distributed-traffic-gqa.csv", columns=bytes_columns)
    print("# peak memory per rank, forward (exact bytes allocated; the input shards not counted)")
    _show(memory, args.out / "distributed-memory.csv")
    print(f"# forward time at N={sizes['time_n']}, the slowest rank, best of {sizes['repeats']}; "
          f"oversubscribed: more processes than the {os.cpu_count()} cores")
    _show(timing, args.out / "distributed-time.csv", digits={name: 4 for name in ("seconds", "median_seconds",
                                                                                   "min_seconds", "max_seconds")})
    plot = args.out / "distributed.png"
    try:
        distributed.plot_distributed(traffic, memory, timing, plot,
                                     title=f"Ring attention vs Ulysses, one thread per rank: {description}")
    except ImportError:   # the CSVs hold the numbers
        print("matplotlib is not installed: no plot")
    else:
        print(f"wrote {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
