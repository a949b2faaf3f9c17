"""Chapter 13's cached recall runs: train them, or check that training again gives them.

    .venv/bin/python tools/train_recall.py            # (re)write attn_course/recall/trained/histories.json
    .venv/bin/python tools/train_recall.py --check    # re-train every run, exit 1 if one differs

The runs (`attn_course.recall.trained` reads them; `attn_course.recall.training` trains and scores): each model
of `attn_course.recall.training.MODELS` (softmax, linear attention, the gated delta rule, and the hybrid of one
delta-rule layer under one softmax layer), at learning rates 0.01 and 0.03 (Zoology compares each model at its
best rate; `attn_course.recall.trained.recall_table` picks it), seeds 0, 1, 2, with `RunSetup`'s defaults
otherwise: 600 steps of 32 sequences of 4 to 16 pairs, scored at 4 to 64 pairs every 200 steps.

Each run is deterministic on one CPU (one thread, its own generators): where the cache was made, `--check`
finds every history float for float, with the same SHA-256 of the weights at every record, and says "bit for
bit". On another CPU's vectorised kernels the last bits differ and grow through training; `--check` then
prints the largest difference of the loss and the accuracy. Runs go two at a time (`--jobs`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from attn_course._reproducible import largest_difference
from attn_course.recall.trained import HISTORIES, trained_folder
from attn_course.recall.training import MODELS, RunSetup, train_recall_model

SEEDS = (0, 1, 2)


LEARNING_RATES = (1e-2, 3e-2)


def setups() -> list[RunSetup]:
    """Every model's setup at each learning rate, in the order the cache keeps their runs (seeds innermost)."""
    return [RunSetup(mixers=mixers, learning_rate=rate) for mixers in MODELS.values() for rate in LEARNING_RATES]


def run(job: tuple[RunSetup, int]) -> tuple[dict, float]:
    setup, seed = job
    started = time.monotonic()
    _, history = train_recall_model(seed, setup)
    return history.as_dict(), time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="re-train and compare with the cache")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    jobs = [(setup, seed) for setup in setups() for seed in SEEDS]
    made: list[dict] = []
    started = time.monotonic()
    with ProcessPoolExecutor(args.jobs) as pool:
        for (setup, seed), (history, seconds) in zip(jobs, pool.map(run, jobs)):
            made.append(history)
            accuracy = " ".join(f"{p}:{a:.2f}" for p, a in zip(history["pairs"], history["accuracy"][-1]))
            print(f"{'+'.join(setup.mixers)} lr {setup.learning_rate:g} seed {seed}: loss {history['loss'][-1]:.3f}, "
                  f"accuracy by P {accuracy}, {seconds:.1f} s", flush=True)
    print(f"{len(jobs)} runs in {time.monotonic() - started:.0f} s")
    path = trained_folder() / HISTORIES
    if not args.check:
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(made, indent=None, separators=(",", ":")) + "\n", encoding="utf-8")
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
        return 0
    cached = json.loads(path.read_text(encoding="utf-8"))
    made = json.loads(json.dumps(made))                       # as the cache holds it: tuples become lists
    if made == cached:
        print("every run reproduced bit for bit (every measure and every digest of the weights)")
        return 0
    for fresh, old in zip(made, cached):
        gaps = {key: largest_difference(fresh[key], old[key]) for key in ("loss", "accuracy")}
        same = sum(a == b for a, b in zip(fresh["digests"], old["digests"]))
        print(f"{'+'.join(fresh['setup']['mixers'])} lr {fresh['setup']['learning_rate']:g} seed {fresh['seed']}: "
              f"largest differences {gaps}, {same} of {len(old['digests'])} digests equal, "
              f"setup {'equal' if fresh['setup'] == old['setup'] else 'different'}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
