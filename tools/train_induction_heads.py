"""Chapter 11's cached runs: train them, or check that training again gives them (within a tolerance).

    .venv/bin/python tools/train_induction_heads.py            # (re)write attn_course/circuits/trained/
    .venv/bin/python tools/train_induction_heads.py --check    # re-train everything, exit 1 beyond TOLERANCE

What it makes (`attn_course.circuits.trained` reads it):

- the histories of `train_induction_model` for seeds 0 .. 9 (`--seeds`), each `--steps` steps recorded every
  `--record-every`, and of `train_rhymes_model` for seed 0, in `histories.json`;
- the weights of the induction runs of seeds 0, 1 and 6 (`--keep-weights`; seed 0's layer 0 has a
  previous-token head, seed 1's a duplicate-token head instead, seed 6's both) and of the rhymes run, as
  safetensors.

Every run is deterministic on one CPU (one thread, its own generators; see `attn_course.circuits.training`):
where the cache was made, `--check` finds the histories float for float and the weights' SHA-256 (the last
digest of each history is that of the cached weights) and says "bit for bit". Float32 training follows the
CPU's vectorised kernels, though: on another CPU (AVX2 against AVX-512, or `ATEN_CPU_CAPABILITY` set) the
last bits differ from the first step. `--check` then compares every recorded number, and every weight, within
TOLERANCE, and prints the largest difference. Measured on the course's 2-core machine with other jobs on
the cores: 31-47 s per induction seed (2000 steps, each scored 81 times on 128 sequences and their control),
172 s for the rhymes (1500 steps of 128 characters, measured lightly loaded); about 10 minutes in all.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import sys
import time

import torch

from attn_course.circuits.rhymes import RhymesSetup, train_rhymes_model
from attn_course.circuits.trained import HISTORIES, load_model, save_model, trained_folder
from attn_course.circuits.training import InductionSetup, state_digest, train_induction_model

# The largest difference --check accepts between a fresh run and the cache, in any recorded loss or score and
# in any weight, where the bits differ (another CPU's kernels). On an AMD EPYC, with ATen's AVX-512 and its AVX2
# kernels, seed 0 ended 1.1e-05 and 1.7e-05 from the cache after 1000 steps.
TOLERANCE = 1e-3
DEFAULTS = {"seeds": list(range(10)), "steps": 2000, "record_every": 25, "keep_weights": [0, 1, 6],
            "rhymes_seeds": [0], "rhymes_steps": 1500, "rhymes_record_every": 100}


def train_all(arguments: dict) -> tuple[dict, dict]:
    """``(histories, models)``: every run's history (JSON-ready) and the models whose weights are kept."""
    histories: dict = {"arguments": arguments, "torch": torch.__version__,
                       "setup": {"induction": dataclasses.asdict(InductionSetup()),
                                 "rhymes": dataclasses.asdict(RhymesSetup())},
                       "induction": {}, "rhymes": {}}
    models = {}
    for seed in arguments["seeds"]:
        start = time.perf_counter()
        model, history = train_induction_model(seed, arguments["steps"], record_every=arguments["record_every"])
        histories["induction"][str(seed)] = history.as_dict()
        if seed in arguments["keep_weights"]:
            models[f"induction_seed{seed}"] = model
        print(f"induction seed {seed}: {time.perf_counter() - start:.1f} s", flush=True)
    for seed in arguments["rhymes_seeds"]:
        start = time.perf_counter()
        model, history = train_rhymes_model(seed, arguments["rhymes_steps"],
                                            record_every=arguments["rhymes_record_every"])
        histories["rhymes"][str(seed)] = history.as_dict()
        models[f"rhymes_seed{seed}"] = model
        print(f"rhymes seed {seed}: {time.perf_counter() - start:.1f} s", flush=True)
    return histories, models


def write(folder: pathlib.Path, histories: dict, models: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.safetensors"):
        old.unlink()
    for name, model in models.items():
        save_model(model, folder / f"{name}.safetensors")
        (folder / f"{name}.safetensors").chmod(0o644)                    # safetensors writes 0600
    text = json.dumps(histories, sort_keys=True, separators=(",", ":"))     # compact: ~30% smaller than indented
    (folder / HISTORIES).write_text(text + "\n", encoding="utf-8")


def _numbers(values) -> torch.Tensor:
    """The numbers of a (nested) list, flattened; None (no training loss at step 0) as NaN."""
    if isinstance(values, list):
        return torch.cat([_numbers(v) for v in values]) if values else torch.zeros(0, dtype=torch.float64)
    return torch.tensor([math.nan if values is None else float(values)], dtype=torch.float64)


def check(folder: pathlib.Path, histories: dict, models: dict) -> tuple[list[str], float]:
    """``(problems, largest)``: what differs beyond TOLERANCE between a fresh run and the cache (empty: none),
    and the largest difference found in a recorded number or a weight (0.0: the same bits)."""
    cached = json.loads((folder / HISTORIES).read_text(encoding="utf-8"))
    problems, largest = [], 0.0
    for kind in ("induction", "rhymes"):
        for seed, history in histories[kind].items():
            fresh, old = json.loads(json.dumps(history)), cached[kind].get(seed)
            if old is None or any(fresh[key] != old.get(key) for key in ("seed", "setup", "steps")) \
                    or set(fresh) != set(old):
                problems.append(f"{kind} seed {seed}: not in the cache, or recorded otherwise")
                continue
            for name in sorted(set(fresh) - {"seed", "setup", "steps", "digests"}):
                a, b = _numbers(fresh[name]), _numbers(old[name])
                gap = float((a - b).abs().nan_to_num(0.0).max()) if a.shape == b.shape else math.inf
                largest = max(largest, gap)
                if gap > TOLERANCE or not torch.equal(a.isnan(), b.isnan()):
                    problems.append(f"{kind} seed {seed}: {name} differs from the cache by {gap:.2g}")
    for name, model in models.items():
        path = folder / f"{name}.safetensors"
        if not path.is_file():
            problems.append(f"{name}: {path} is missing")
            continue
        cached_model = load_model(path)
        if state_digest(cached_model) == state_digest(model):
            continue
        fresh_state = model.state_dict()
        gap = max(float((tensor - fresh_state[key]).abs().max()) for key, tensor in cached_model.state_dict().items())
        largest = max(largest, gap)
        if gap > TOLERANCE:
            problems.append(f"{name}: weights differ from {path} by {gap:.2g}")
    return problems, largest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="re-train and compare with the cache; write nothing")
    parser.add_argument("--seeds", type=int, nargs="+", default=DEFAULTS["seeds"])
    parser.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    parser.add_argument("--record-every", type=int, default=DEFAULTS["record_every"])
    parser.add_argument("--keep-weights", type=int, nargs="*", default=DEFAULTS["keep_weights"])
    parser.add_argument("--rhymes-seeds", type=int, nargs="*", default=DEFAULTS["rhymes_seeds"])
    parser.add_argument("--rhymes-steps", type=int, default=DEFAULTS["rhymes_steps"])
    parser.add_argument("--rhymes-record-every", type=int, default=DEFAULTS["rhymes_record_every"])
    parser.add_argument("--folder", type=pathlib.Path, default=trained_folder())
    options = parser.parse_args(argv)
    arguments = {key: getattr(options, key) for key in DEFAULTS}
    histories, models = train_all(arguments)
    if options.check:
        problems, largest = check(options.folder, histories, models)
        if problems:
            print("\n".join(problems))
        elif largest == 0.0:
            print("the cache matches a fresh run bit for bit")
        else:
            print(f"the cache matches a fresh run within {TOLERANCE} (largest difference {largest:.2g}; "
                  "another CPU's kernels round the last bits differently)")
        return 1 if problems else 0
    write(options.folder, histories, models)
    sizes = {path.name: path.stat().st_size for path in sorted(options.folder.iterdir())}
    print(f"wrote {options.folder}: " + ", ".join(f"{name} {size / 1024:.0f} KiB" for name, size in sizes.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
