"""Chapter 12's cached runs: train them, or check that training again gives them.

    .venv/bin/python tools/train_open_models.py            # (re)write attn_course/open_models/trained/histories.json
    .venv/bin/python tools/train_open_models.py --check    # re-train every run, exit 1 if one differs

The runs (`attn_course.open_models.trained` reads them; `attn_course.open_models.training` trains and measures):

- `qk_norm`: the small decoder on nursery rhymes, at learning rates 0.01, 0.03 and 0.1, without and with
  QK-norm, seeds 0, 1, 2: 600 steps of 16 sequences, recorded every 25;
- `sinks_and_gates`: on repeats, a plain model, one with learned sinks and one with an output gate, seeds 0,
  1, 2: 2,000 steps of 32 sequences at 3e-3 after 100 steps of warm-up, recorded every 100.

Each run is deterministic on one CPU (one thread, its own generators): where the cache was made, `--check`
finds every history float for float, with the same SHA-256 of the weights at every record, and says "bit for
bit". On another CPU's vectorised kernels the last bits differ and grow through training; `--check` then
prints the largest difference of each measure. Runs go two at a time (`--jobs`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from attn_course._reproducible import largest_difference
from attn_course.open_models.trained import EXPERIMENTS, HISTORIES, trained_folder
from attn_course.open_models.training import RunSetup, train_small_decoder

SEEDS = (0, 1, 2)


def experiment_setups() -> dict[str, list[RunSetup]]:
    """Each experiment's setups, in the order the cache keeps their runs (seeds innermost)."""
    qk_norm = [RunSetup(task="rhymes", learning_rate=rate, steps=600, record_every=25, qk_norm=normed)
               for rate in (0.01, 0.03, 0.1) for normed in (False, True)]
    choices = [RunSetup(task="repeats", learning_rate=3e-3, steps=2000, record_every=100, warmup_steps=100,
                        batch_size=32, sinks=switch == "sinks", output_gate=switch == "gate")
               for switch in ("plain", "sinks", "gate")]
    return {"qk_norm": qk_norm, "sinks_and_gates": choices}


def run(job: tuple[str, RunSetup, int]) -> tuple[str, dict, float]:
    experiment, setup, seed = job
    started = time.monotonic()
    _, history = train_small_decoder(seed, setup)
    return experiment, history.as_dict(), time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="re-train and compare with the cache")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    setups = experiment_setups()
    jobs = [(name, setup, seed) for name in EXPERIMENTS for setup in setups[name] for seed in SEEDS]
    made: dict[str, list[dict]] = {name: [] for name in EXPERIMENTS}
    with ProcessPoolExecutor(args.jobs) as pool:
        for (name, setup, seed), (_, history, seconds) in zip(jobs, pool.map(run, jobs)):
            made[name].append(history)
            print(f"{name} seed {seed} {setup}: loss {history['loss'][-1]:.3f}, {seconds:.0f} s", flush=True)
    path = trained_folder() / HISTORIES
    if not args.check:
        path.write_text(json.dumps(made, indent=None, separators=(",", ":")) + "\n", encoding="utf-8")
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
        return 0
    cached = json.loads(path.read_text(encoding="utf-8"))
    if made == cached:
        print("every run reproduced bit for bit (every measure and every digest of the weights)")
        return 0
    for name in EXPERIMENTS:
        for fresh, old in zip(made[name], cached[name]):
            gaps = {key: largest_difference(fresh[key], old[key]) for key in
                    ("loss", "largest_logit", "first_token_mass", "sink_share", "largest_activation")}
            print(f"{name} seed {fresh['seed']}: largest differences {gaps}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
