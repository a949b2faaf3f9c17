"""The cached runs that chapter 11 reads instead of training them live (made by ``tools/train_induction_heads.py``).

Files in ``attn_course/circuits/trained/``, shipped with the package:

- ``induction_seed{S}.safetensors``: the weights of :func:`~attn_course.circuits.training.train_induction_model`
  for seed ``S`` after ``steps`` steps, the model's config in the file's metadata;
- ``rhymes_seed{S}.safetensors``: the same for :func:`~attn_course.circuits.rhymes.train_rhymes_model`;
- ``histories.json``: every run's history (``{"induction": {seed: history}, "rhymes": {seed: history}}``) and
  the arguments each was made with.

The last digest of a history whose weights are kept is the SHA-256 of those weights
(:func:`~attn_course.circuits.training.state_digest`), so weights and measurements are known to belong
together; ``tools/train_induction_heads.py --check`` re-trains and compares: bit for bit on the CPU
that made the cache, within a tolerance on another (whose vectorised kernels round the last bits differently).
"""

from __future__ import annotations

import json
import pathlib
from importlib import resources

from safetensors.torch import load_file, safe_open, save_file

from attn_course import _validate
from attn_course.models.attention_only import AttentionOnlyConfig, AttentionOnlyTransformer

__all__ = ["trained_folder", "save_model", "load_model", "load_trained", "load_rhymes_model", "trained_histories",
           "trained_seeds", "HISTORIES"]

HISTORIES = "histories.json"


def trained_folder() -> pathlib.Path:
    """The folder of the cached files inside the installed package."""
    return pathlib.Path(str(resources.files("attn_course.circuits").joinpath("trained")))


def save_model(model: AttentionOnlyTransformer, path: str | pathlib.Path) -> None:
    """Write ``model``'s weights to a safetensors file, its config as JSON in the metadata.

    Raises:
        TypeError: ``model`` not an AttentionOnlyTransformer, ``path`` not a path.
    """
    if not isinstance(model, AttentionOnlyTransformer):
        raise TypeError(f"save_model: model must be an AttentionOnlyTransformer, got {type(model).__name__}")
    path = _validate.path("save_model", "path", path)
    state = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    save_file(state, str(path), metadata={"config": json.dumps(model.config.as_dict(), sort_keys=True)})


def load_model(path: str | pathlib.Path) -> AttentionOnlyTransformer:
    """The :class:`~attn_course.models.attention_only.AttentionOnlyTransformer` of a :func:`save_model` file, eval mode.

    Raises:
        TypeError: ``path`` not a path. FileNotFoundError: no such file.
        ValueError: a file without the model's config, or whose weights do not fit it.
    """
    path = _validate.existing_file("load_model", "path", path, what="model file")
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    if "config" not in metadata:
        raise ValueError(f"load_model: {path} has no 'config' in its metadata; was it written by save_model?")
    config = AttentionOnlyConfig(**json.loads(metadata["config"]))
    model = AttentionOnlyTransformer(**config.as_dict())
    model.load_state_dict(load_file(str(path)), strict=True)
    return model.eval()


def trained_histories(kind: str = "induction") -> dict[int, dict]:
    """The cached histories: ``{seed: history dict}`` (see :class:`~attn_course.circuits.training.InductionHistory`).

    Args:
        kind: ``"induction"`` (repeated random tokens) or ``"rhymes"``.

    Raises:
        ValueError: another ``kind``. FileNotFoundError: the cache is missing.

    Example:
        >>> histories = trained_histories()
        >>> len(histories) >= 5
        True
    """
    if kind not in ("induction", "rhymes"):
        raise ValueError(f"trained_histories: kind must be 'induction' or 'rhymes', got {kind!r}")
    data = json.loads((trained_folder() / HISTORIES).read_text(encoding="utf-8"))
    return {int(seed): history for seed, history in data[kind].items()}


def trained_seeds(kind: str = "induction") -> list[int]:
    """The seeds whose weights are cached, in order."""
    if kind not in ("induction", "rhymes"):
        raise ValueError(f"trained_seeds: kind must be 'induction' or 'rhymes', got {kind!r}")
    return sorted(int(path.stem.rsplit("seed", 1)[1]) for path in trained_folder().glob(f"{kind}_seed*.safetensors"))


def load_trained(seed: int = 0) -> AttentionOnlyTransformer:
    """The cached model trained on repeated random tokens with ``seed`` (eval mode).

    Raises:
        TypeError: ``seed`` not an int. ValueError: no cached weights for that seed (the error lists those there are).

    Example:
        >>> model = load_trained(0)
        >>> model.config.n_layers
        2
    """
    seed = _validate.integer("load_trained", "seed", seed, minimum=0)
    return _load("load_trained", "induction", seed)


def load_rhymes_model(seed: int = 0) -> AttentionOnlyTransformer:
    """The cached model trained on the rhymes' characters (eval mode).

    Its vocabulary is :func:`~attn_course.circuits.rhymes.rhymes_tokenizer`'s.
    """
    seed = _validate.integer("load_rhymes_model", "seed", seed, minimum=0)
    return _load("load_rhymes_model", "rhymes", seed)


def _load(where: str, kind: str, seed: int) -> AttentionOnlyTransformer:
    path = trained_folder() / f"{kind}_seed{seed}.safetensors"
    if not path.is_file():
        raise ValueError(f"{where}: no cached weights for seed {seed}; cached seeds: {trained_seeds(kind)}")
    return load_model(path)

