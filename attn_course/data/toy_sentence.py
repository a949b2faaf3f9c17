"""A hand-built embedding of "The bank of the river was muddy.", small enough to read.

Real models learn their embeddings; this one is written by hand so that every number
can be explained. Each token is described by six named *features*::

    thing     the word names a thing (a noun)
    nature    it is about rivers, land, water, mud
    money     it is about finance
    property  it describes a thing (an adjective)
    grammar   a function word: the, of, was
    end       the full stop

"bank" is ambiguous, so it has a little of both ``nature`` and ``money``.

The three roles of attention are then:

* **value** = the token's features (``W_V`` is the 6 × 6 identity): its content.
* **key** = the token's features too (``W_K`` is the 6 × 6 identity): what it offers.
* **query** = ``x @ W_Q``: row ``f`` of ``W_Q`` says which features a token that has
  feature ``f`` looks for. A thing looks for nature/money context (that settles
  which thing it is) and a little for descriptions; a property looks for the thing
  it describes; a grammar word looks for the noun it belongs to.

So a score ``q_i · k_j`` is "how much of what token *i* wants does token *j* offer".

Finally the six features are *lifted* into ``d_k`` dimensions (64 by default; at 6, the identity) by a fixed
matrix ``L [6, d_k]`` with orthonormal rows (``L Lᵀ = I``): ``Q = X W_Q L``, ``K = X L``,
``V = X L``. The lift only makes the vectors look like a real model's (dense, 64 wide);
it changes no score, since ``Q Kᵀ = X W_Q L Lᵀ Xᵀ = X W_Q Xᵀ`` whatever ``d_k`` is. So
``d_k`` does not set the scale of the scores here, and nothing in this toy derives the
division by 8: 8 is the default scaling factor of the concept card the course is built
from (``√d_k`` with ``d_k = 64``). ``W_Q`` is the table of wants times 8 so that, after
that division, the scaled scores are exactly ``X · wants · Xᵀ``, numbers one can read.
Divided by ``√6`` instead (the formula's value for ``d_k = 6``), the same scores would
give sharper weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attn_course import _validate

__all__ = ["SENTENCE", "TOKENS", "FEATURES", "ToySentence", "bank_sentence"]

SENTENCE = "The bank of the river was muddy."
TOKENS = ("The", "bank", "of", "the", "river", "was", "muddy", ".")
FEATURES = ("thing", "nature", "money", "property", "grammar", "end")

# Rows follow TOKENS, columns follow FEATURES.
_WORD_FEATURES = [
    # thing nature money property grammar end
    [0.0, 0.0, 0.0, 0.0, 1.0, 0.0],  # The
    [1.0, 0.4, 0.4, 0.0, 0.0, 0.0],  # bank: a thing, of nature or of money
    [0.0, 0.0, 0.0, 0.0, 1.0, 0.0],  # of
    [0.0, 0.0, 0.0, 0.0, 1.0, 0.0],  # the
    [1.0, 1.0, 0.0, 0.0, 0.0, 0.0],  # river: a thing, clearly of nature
    [0.0, 0.0, 0.0, 0.0, 1.0, 0.0],  # was
    [0.0, 0.5, 0.0, 1.0, 0.0, 0.0],  # muddy: a property, of nature
    [0.0, 0.0, 0.0, 0.0, 0.0, 1.0],  # .
]

# Row = a feature the query token has; column = a feature it looks for in keys.
_WANTS = [
    # thing nature money property grammar end
    [0.0, 3.0, 3.0, 1.0, 0.5, 0.0],  # a thing wants context, and a little description
    [0.0, 1.0, 0.0, 0.0, 0.0, 0.0],  # nature wants more nature
    [0.0, 0.0, 1.0, 0.0, 0.0, 0.0],  # money wants more money
    [3.0, 1.0, 0.0, 0.0, 0.0, 0.0],  # a property wants the thing it describes
    [2.0, 0.0, 0.0, 0.0, 0.5, 0.0],  # a grammar word wants its noun
    [1.0, 1.0, 1.0, 1.0, 1.0, 0.0],  # the full stop looks at everything
]
# W_Q = wants × 8, so that scores / 8 (8: the card's default √d_k, see the module
# docstring) equal X · wants · Xᵀ. The lift does not change any score.
_SCORE_SPREAD = 8.0


@dataclass(frozen=True)
class ToySentence:
    """The toy sentence's tokens, features, projections and their lift to ``d_k``.

    Attributes:
        tokens: the ``N`` tokens.
        feature_names: the ``F`` feature names.
        embeddings: ``X [N, F]``, the tokens' features.
        w_q, w_k, w_v: ``[F, F]`` projections on the features, before the lift (``w_k`` and
            ``w_v`` are the ``F × F`` identity; ``w_q`` is the wants table times 8).
        lift: ``L [F, d_k]`` with orthonormal rows; maps features into ``d_k`` dimensions
            without changing any dot product (``L Lᵀ = I``).
    """

    tokens: tuple[str, ...]
    feature_names: tuple[str, ...]
    embeddings: torch.Tensor
    w_q: torch.Tensor
    w_k: torch.Tensor
    w_v: torch.Tensor
    lift: torch.Tensor

    @property
    def d_k(self) -> int:
        return self.lift.shape[1]

    @property
    def queries(self) -> torch.Tensor:
        """``Q = X W_Q L``: ``[N, d_k]``."""
        return self.embeddings @ self.w_q @ self.lift

    @property
    def keys(self) -> torch.Tensor:
        """``K = X W_K L = X L``: ``[N, d_k]``."""
        return self.embeddings @ self.w_k @ self.lift

    @property
    def values(self) -> torch.Tensor:
        """``V = X W_V L = X L``: ``[N, d_k]``."""
        return self.embeddings @ self.w_v @ self.lift

    def to_features(self, vectors: torch.Tensor) -> torch.Tensor:
        """Read ``[..., d_k]`` vectors back as ``[..., F]`` named features."""
        vectors = _validate.floating_tensor("ToySentence.to_features", "vectors", vectors, min_dim=1)
        if vectors.shape[-1] != self.d_k:
            raise ValueError(
                f"ToySentence.to_features: vectors must end in d_k={self.d_k}, "
                f"got shape {_validate.shape_str(vectors)}"
            )
        return vectors @ self.lift.T

    def index(self, token: str) -> int:
        """Position of the first occurrence of ``token`` (``"the"`` and ``"The"`` differ)."""
        if token not in self.tokens:
            raise ValueError(f"ToySentence.index: token must be one of {list(self.tokens)}, got {token!r}")
        return self.tokens.index(token)


def bank_sentence(d_k: int = 64, *, dtype: torch.dtype = torch.float32) -> ToySentence:
    """The hand-built embedding of "The bank of the river was muddy.".

    Deterministic: the lift comes from a fixed seed, and every dot product is exact
    whatever the seed and whatever ``d_k``, because the lift's rows are orthonormal:
    ``bank_sentence(6)`` and ``bank_sentence(64)`` give the same scores ``Q Kᵀ``.

    Args:
        d_k: width of the query/key/value vectors, at least ``len(FEATURES)`` = 6.
        dtype: a floating dtype for every tensor.

    Returns:
        A :class:`ToySentence`. Its ``queries``, ``keys`` and ``values`` are
        ``[8, d_k]``.

    Raises:
        TypeError: ``d_k`` not an int, or ``dtype`` not floating.
        ValueError: ``d_k`` below 6.

    At ``d_k = 6`` the lift is the identity: the keys and values are the features themselves.

    Example:
        >>> bank_sentence(6).keys[bank_sentence().index("river")]   # thing, nature: a noun of nature
        tensor([1., 1., 0., 0., 0., 0.])
        >>> sentence = bank_sentence()
        >>> scores = sentence.queries @ sentence.keys.T / 8
        >>> sentence.tokens[int(scores[sentence.index("bank")].argmax())]
        'river'
    """
    d_k = _validate.integer("bank_sentence", "d_k", d_k, minimum=len(FEATURES))
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"bank_sentence: dtype must be a floating torch.dtype, got {dtype!r}")
    generator = torch.Generator().manual_seed(0)
    gaussian = torch.randn(d_k, d_k, generator=generator, dtype=torch.float64)
    orthogonal, _ = torch.linalg.qr(gaussian)                      # [d_k, d_k]
    identity = torch.eye(len(FEATURES), dtype=torch.float64)
    # At d_k = 6 there is nothing to lift into: the vectors are the features themselves, so that
    # chapter 01 can read every key and value as named features.
    lift = identity if d_k == len(FEATURES) else orthogonal[:, : len(FEATURES)].T.contiguous()  # [F, d_k]
    return ToySentence(
        tokens=TOKENS,
        feature_names=FEATURES,
        embeddings=torch.tensor(_WORD_FEATURES, dtype=dtype),
        w_q=(torch.tensor(_WANTS, dtype=torch.float64) * _SCORE_SPREAD).to(dtype),
        w_k=identity.to(dtype),
        w_v=identity.to(dtype),
        lift=lift.to(dtype),
    )
