"""The cached runs chapter 12 reads instead of training them live (made by ``tools/train_open_models.py``).

``attn_course/open_models/trained/histories.json`` holds, per experiment, every run's
:class:`~attn_course.open_models.training.RunHistory` as a dict (its ``setup`` is the
:class:`~attn_course.open_models.training.RunSetup` it was trained with, so ``RunSetup(**run["setup"])``
re-creates it). ``tools/train_open_models.py --check`` re-trains every run and compares: bit for bit on the
CPU that made the cache, within a tolerance on another.
"""

from __future__ import annotations

import json
import pathlib
from importlib import resources

__all__ = ["HISTORIES", "EXPERIMENTS", "trained_folder", "trained_runs"]

HISTORIES = "histories.json"
#: ``"qk_norm"``: nursery rhymes at three learning rates, with and without QK-norm; ``"sinks_and_gates"``:
#: repeats, a plain model, one with learned sinks and one with an output gate.
EXPERIMENTS = ("qk_norm", "sinks_and_gates")


def trained_folder() -> pathlib.Path:
    """The folder of the cache inside the installed package."""
    return pathlib.Path(str(resources.files("attn_course.open_models").joinpath("trained")))


def trained_runs(experiment: str) -> list[dict]:
    """Every cached run of ``experiment`` (a history dict each), in the order they were made.

    Raises:
        ValueError: an unknown experiment. FileNotFoundError: the cache is missing.

    Example:
        >>> runs = trained_runs("qk_norm")
        >>> sorted({run["setup"]["qk_norm"] for run in runs})
        [False, True]
    """
    if experiment not in EXPERIMENTS:
        raise ValueError(f"trained_runs: experiment must be one of {', '.join(map(repr, EXPERIMENTS))}, "
                         f"got {experiment!r}")
    return json.loads((trained_folder() / HISTORIES).read_text(encoding="utf-8"))[experiment]
