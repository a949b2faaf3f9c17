"""Chapter 05's "does RoPE help?": position schemes trained alike, their held-out loss along training."""

from __future__ import annotations

from attn_course import _validate
from attn_course.data.rhymes import load_rhymes
from attn_course.models.position_model import POSITION_SCHEMES, PositionConfig, PositionLanguageModel
from attn_course.models.training import TrainingHistory, train_language_model

__all__ = ["position_learning_curves"]


def position_learning_curves(positions: tuple[str, ...] = ("learned", "rope"), text: str | None = None, *,
                             train_length: int = 32, embed_dim: int = 32, num_heads: int = 4, num_layers: int = 2,
                             steps: int = 300, batch_size: int = 16, learning_rate: float = 3e-3, eval_every: int = 25,
                             validation_fraction: float = 0.1, seed: int = 0) -> dict[str, TrainingHistory]:
    """Train one ``PositionLanguageModel`` per scheme, alike, and record their held-out loss.

    Every model is trained by chapter 04's :func:`~attn_course.models.training.train_language_model` with the
    same arguments: the same seed (the same batches, in the same order), steps and learning rate, and the same
    held-out tail of ``text`` (the last ``validation_fraction``, cut at a blank line), scored every
    ``eval_every`` steps and before the first. Nothing stops early. A ``"learned"`` model gets exactly
    ``train_length`` position embeddings, so all of them are trained.

    Args:
        positions: distinct names from :data:`~attn_course.models.position_model.POSITION_SCHEMES`.
        text: the text (default: chapter 04's rhymes, :func:`~attn_course.data.rhymes.load_rhymes`).
        train_length: ``N``, the characters per training and held-out window.
        embed_dim, num_heads, num_layers: the model's sizes (``PositionConfig``'s).
        steps, batch_size, learning_rate: optimisation steps, windows per step, peak (cosine-decayed) rate.
        eval_every, validation_fraction: steps between two held-out scorings; share of ``text`` held out, in
            ``(0, 1)``.
        seed: seeds the weights and the batches.

    Returns:
        ``{position: TrainingHistory}`` in the order of ``positions``; each history's ``validation_steps`` and
        ``validation_losses`` (nats per character) are the curve.

    Raises:
        TypeError, ValueError: ``positions`` not a non-empty tuple or list of distinct scheme names, a
            ``validation_fraction`` outside ``(0, 1)``, or any argument that ``train_language_model`` or
            ``PositionConfig`` refuses.

    Example:
        >>> curves = position_learning_curves(("learned", "rope"), steps=2, eval_every=1)
        >>> {name: history.validation_steps for name, history in curves.items()}
        {'learned': [0, 1, 2], 'rope': [0, 1, 2]}
    """
    where = "position_learning_curves"
    if not isinstance(positions, (tuple, list)) or not positions:
        raise TypeError(f"{where}: positions must be a non-empty tuple or list of names from {POSITION_SCHEMES}, "
                        f"got {positions!r}")
    if len(set(positions)) != len(positions):
        raise ValueError(f"{where}: positions must be distinct, got {list(positions)}")
    validation_fraction = _validate.dropout(where, validation_fraction, name="validation_fraction")
    if validation_fraction == 0:
        raise ValueError(f"{where}: validation_fraction must lie in (0, 1): the curves are held-out losses, got 0")
    text = load_rhymes() if text is None else text
    train_length = _validate.integer(where, "train_length", train_length, minimum=1)
    for position in positions:                                          # check every name before training
        PositionConfig(1, position, train_length, embed_dim, num_heads, num_layers)
    curves = {}
    for position in positions:
        def make_model(vocab_size: int, position: str = position) -> PositionLanguageModel:
            return PositionLanguageModel(PositionConfig(vocab_size, position, train_length, embed_dim, num_heads,
                                                        num_layers))

        _, _, history = train_language_model(
            text, steps=steps, batch_size=batch_size, sequence_length=train_length, learning_rate=learning_rate,
            validation_fraction=validation_fraction, eval_every=eval_every, patience=None, seed=seed,
            progress=False, make_model=make_model,
        )
        curves[position] = history
    return curves
