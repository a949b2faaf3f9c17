"""The cached runs chapter 13 reads instead of training them all live (made by ``tools/train_recall.py``).

``attn_course/recall/trained/histories.json`` holds a list of every run's
:class:`~attn_course.recall.training.RunHistory` as a dict (its ``setup`` is the
:class:`~attn_course.recall.training.RunSetup` it was trained with, so ``RunSetup(**run["setup"])``
re-creates it). ``tools/train_recall.py --check`` re-trains every run and compares: bit for bit on the CPU
that made the cache.
"""

from __future__ import annotations

import json
import pathlib
from importlib import resources

import pandas as pd

from attn_course import _validate
from attn_course.recall.training import MODELS

__all__ = ["HISTORIES", "trained_folder", "trained_runs", "model_name", "recall_table"]

HISTORIES = "histories.json"


def trained_folder() -> pathlib.Path:
    """The folder of the cache inside the installed package."""
    return pathlib.Path(str(resources.files("attn_course.recall").joinpath("trained")))


def trained_runs() -> list[dict]:
    """Every cached run (a history dict each), in the order they were made: model by model, seeds innermost.

    Raises:
        FileNotFoundError: the cache is missing.

    Example:
        >>> runs = trained_runs()
        >>> sorted({model_name(run) for run in runs}) == sorted(MODELS)
        True
    """
    return json.loads((trained_folder() / HISTORIES).read_text(encoding="utf-8"))


def model_name(run: dict) -> str:
    """The key of :data:`~attn_course.recall.training.MODELS` whose mixers ``run`` trained (``"custom"`` if none).

    Raises:
        TypeError: ``run`` not a history dict. ValueError: it has no ``setup["mixers"]``.

    Example:
        >>> model_name({"setup": {"mixers": ["delta", "softmax"]}})
        'hybrid'
    """
    _validate.instance("model_name", "run", run, dict)
    try:
        mixers = tuple(run["setup"]["mixers"])
    except (KeyError, TypeError):
        raise ValueError("model_name: run must be a history dict with setup['mixers']") from None
    return next((name for name, layers in MODELS.items() if layers == mixers), "custom")


def recall_table(runs: list[dict] | None = None, *, best_rate: bool = True) -> pd.DataFrame:
    """Final recall accuracy per model and ``P``: mean, min and max over the seeds, one row each.

    Args:
        runs: history dicts (default :func:`trained_runs`); each one's last record is read.
        best_rate: keep, for each model, only the runs at its best learning rate (the highest mean accuracy
            over seeds and ``P``), as Zoology compares models; False: one row per model, rate and ``P``.

    Returns:
        a DataFrame with columns ``model``, ``learning_rate``, ``pairs``, ``mean``, ``min``, ``max``, ``seeds``,
        in the order of :data:`~attn_course.recall.training.MODELS`, then rate, then ``P``.

    Raises:
        TypeError, ValueError: ``runs`` not a non-empty list of history dicts, ``best_rate`` not a bool.

    Example:
        >>> table = recall_table()
        >>> list(table.columns), sorted(set(table["model"])) == sorted(MODELS)
        (['model', 'learning_rate', 'pairs', 'mean', 'min', 'max', 'seeds'], True)
    """
    runs = trained_runs() if runs is None else _validate.sequence("recall_table", "runs", runs, of="history dicts")
    _validate.boolean("recall_table", "best_rate", best_rate)
    if not runs:
        raise ValueError("recall_table: runs must not be empty")
    rows = [{"model": model_name(run), "learning_rate": run["setup"]["learning_rate"], "pairs": pairs,
             "accuracy": accuracy} for run in runs for pairs, accuracy in zip(run["pairs"], run["accuracy"][-1])]
    frame = pd.DataFrame(rows)
    if best_rate:
        by_rate = frame.groupby(["model", "learning_rate"])["accuracy"].mean().reset_index()
        best = by_rate.loc[by_rate.groupby("model")["accuracy"].idxmax(), ["model", "learning_rate"]]
        frame = frame.merge(best, on=["model", "learning_rate"])
    order = {name: index for index, name in enumerate((*MODELS, "custom"))}
    table = (frame.groupby(["model", "learning_rate", "pairs"])["accuracy"]
             .agg(mean="mean", min="min", max="max", seeds="count").reset_index())
    return table.sort_values(["model", "learning_rate", "pairs"], ignore_index=True,
                             key=lambda c: c.map(order) if c.name == "model" else c)
