"""A tiny task on which two attention heads learn two different relations, in seconds on a CPU.

Sequences of random tokens ``x_0 … x_{N-1}`` from a vocabulary of ``V``. At every position
``i ≥ 1`` the model must name two tokens:

    the previous token  x_{i-1}     (a relative position: one step back)
    the first token     x_0         (an absolute position: the start)

The model has a single causal attention layer with two heads and no residual path, so
everything the readout knows must come through attention. After training, one head looks
one step back and the other at the first token: one lookup per head.

Positions use a fixed code of rotating (cos, sin) pairs, like the original Transformer's
sinusoids but with evenly spread frequencies (see :func:`rotating_position_code`), rather than
one learned vector per position: moving one step back turns every pair of the code by the
same angle, at every position, so a head learns "one step back" once for all positions.
With learned per-position vectors the heads occasionally swap roles at some positions.
Chapter 05 (RoPE) builds on the same rotation idea.

How reliable is it? With the default settings, seeds 0 to 29 give two specialised heads (each
above 0.9 on its relation) in 29 runs out of 30; seed 8 ends with one head blending both
relations. A single head (``num_heads=1``) blends in every run we tried (seeds 0 to 5): about
two thirds of its weight on the first token and a quarter to a third on the previous one.
:func:`compare_head_counts` trains several seeds with one and with two heads and reports, for
each run, when its loss first fell below a threshold, its final loss and where its heads look.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from attn_course import _validate
from attn_course.core.multihead import MultiHeadAttention

__all__ = [
    "IGNORE_INDEX",
    "RELATIONS",
    "TwoRelationConfig",
    "TwoRelationModel",
    "RelationScores",
    "make_two_relation_data",
    "rotating_position_code",
    "train_two_relation_model",
    "head_relation_scores",
    "steps_to_reach",
    "HeadCountRun",
    "compare_head_counts",
]

IGNORE_INDEX = -100
"""Targets at position 0, which has no previous token (``F.cross_entropy``'s default ``ignore_index``)."""
RELATIONS = ("previous token", "first token")
"""What the two target slots hold, in order."""


def make_two_relation_data(
    num_sequences: int,
    seq_len: int = 10,
    vocab_size: int = 8,
    *,
    seed: int = 0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token sequences and, for every position, its previous token and the first token.

    Args:
        num_sequences: ``B``, how many sequences.
        seq_len: ``N``, tokens per sequence, at least 3 (from position 2 on, "previous" and
            "first" are different positions).
        vocab_size: ``V``, tokens are ``0 … V-1``; at least 2.
        seed: seeds a fresh generator when ``generator`` is None.
        generator: draw from this ``torch.Generator`` instead (it advances), e.g. to get a
            new batch at every training step.

    Returns:
        ``(tokens [B, N], targets [B, N, 2])``, both int64. ``targets[b, i, 0] = tokens[b, i-1]``
        (the previous token) and ``targets[b, i, 1] = tokens[b, 0]`` (the first token), see
        :data:`RELATIONS`. Position 0 has no previous token: ``targets[:, 0]`` is
        :data:`IGNORE_INDEX`.

    Raises:
        TypeError: non-int sizes or seed, or a generator that is not a ``torch.Generator``.
        ValueError: ``num_sequences < 1``, ``seq_len < 3``, ``vocab_size < 2`` or ``seed < 0``.

    Example:
        >>> tokens, targets = make_two_relation_data(1, seq_len=4, vocab_size=8, seed=0)
        >>> tokens.tolist()
        [[4, 7, 5, 0]]
        >>> targets[0].T.tolist()                        # row 0: previous token, row 1: first token
        [[-100, 4, 7, 5], [-100, 4, 4, 4]]
    """
    where = "make_two_relation_data"
    num_sequences = _validate.integer(where, "num_sequences", num_sequences, minimum=1)
    seq_len = _validate.integer(where, "seq_len", seq_len, minimum=3)
    vocab_size = _validate.integer(where, "vocab_size", vocab_size, minimum=2)
    if generator is None:
        generator = torch.Generator().manual_seed(_validate.integer(where, "seed", seed, minimum=0))
    elif not isinstance(generator, torch.Generator):
        raise TypeError(f"{where}: generator must be a torch.Generator, got {type(generator).__name__}")
    tokens = torch.randint(vocab_size, (num_sequences, seq_len), generator=generator)   # [B, N]
    previous = tokens.roll(1, dims=1)                                   # [B, N]: x_{i-1} (wraps at 0)
    first = tokens[:, :1].expand(-1, seq_len)                           # [B, N]: x_0
    targets = torch.stack([previous, first], dim=-1)                    # [B, N, 2]
    targets[:, 0] = IGNORE_INDEX
    return tokens, targets


def rotating_position_code(seq_len: int, embed_dim: int) -> torch.Tensor:
    """A fixed position code: pairs ``(cos(ω_k n), sin(ω_k n))`` with evenly spaced ``ω_k``.

    The ``K = E / 2`` frequencies are ``ω_k = π (k + ½) / K``, spread over ``(0, π)`` so
    that neighbouring positions differ in every pair. This is *not* the original Transformer's
    sinusoid (Vaswani et al. 2017), whose frequencies fall geometrically,
    ``ω_k = 10000^(-2k/E)``, so that its slowest pairs barely move over a short sequence; for a
    ten-token toy task every pair should turn visibly from one position to the next.

    Going from position ``n`` to ``n - 1`` turns pair ``k`` by the angle ``-ω_k``, the same at
    every ``n``: "one step back" is one fixed linear map of the code.

    Args:
        seq_len: ``N``, number of positions (>= 1).
        embed_dim: ``E``, even (>= 2).

    Returns:
        ``[N, E]`` float32; row ``n`` codes position ``n``. Every row has norm ``√(E/2)``.

    Raises:
        TypeError: non-int sizes.
        ValueError: sizes below their minimum, or an odd ``embed_dim``.

    Example:
        >>> rotating_position_code(3, 4)[0]                       # position 0: cos 0 = 1, sin 0 = 0
        tensor([1., 0., 1., 0.])
    """
    where = "rotating_position_code"
    seq_len = _validate.integer(where, "seq_len", seq_len, minimum=1)
    embed_dim = _validate.integer(where, "embed_dim", embed_dim, minimum=2)
    if embed_dim % 2:
        raise ValueError(f"{where}: embed_dim must be even (cos/sin pairs), got {embed_dim}")
    pairs = embed_dim // 2
    frequencies = math.pi * (torch.arange(pairs, dtype=torch.float64) + 0.5) / pairs     # [K]
    angles = torch.arange(seq_len, dtype=torch.float64)[:, None] * frequencies        # [N, K]
    code = torch.stack([angles.cos(), angles.sin()], dim=-1)                           # [N, K, 2]
    return code.flatten(1).float()                                                     # [N, E]


@dataclass(frozen=True)
class TwoRelationConfig:
    """Sizes of :class:`TwoRelationModel`; the defaults train in about two seconds.

    Attributes:
        vocab_size: ``V``; chance-level loss is ``log V``.
        seq_len: ``N``, the longest sequence the position code covers (>= 3).
        embed_dim: ``E``, even and divisible by ``num_heads``.
        num_heads: ``H``.
        hidden_dim: width of the readout MLP.

    Raises:
        TypeError, ValueError: a field of the wrong type or out of range, named.
    """

    vocab_size: int = 8
    seq_len: int = 10
    embed_dim: int = 32
    num_heads: int = 2
    hidden_dim: int = 128

    def __post_init__(self) -> None:
        where = "TwoRelationConfig"
        _validate.integer(where, "vocab_size", self.vocab_size, minimum=2)
        _validate.integer(where, "seq_len", self.seq_len, minimum=3)
        _validate.integer(where, "embed_dim", self.embed_dim, minimum=2)
        _validate.integer(where, "num_heads", self.num_heads, minimum=1)
        _validate.integer(where, "hidden_dim", self.hidden_dim, minimum=1)
        if self.embed_dim % 2 or self.embed_dim % self.num_heads:
            raise ValueError(
                f"{where}: embed_dim={self.embed_dim} must be even and divisible by "
                f"num_heads={self.num_heads}"
            )


class TwoRelationModel(nn.Module):
    """Token embedding + a rotating position code, one causal multi-head attention, an MLP readout.

    There is no residual connection: the readout sees only what attention delivers. For
    every position it predicts two tokens, in the order of :data:`RELATIONS`.

    Args:
        config: sizes; defaults to ``TwoRelationConfig()``.

    Raises:
        TypeError: ``config`` not a :class:`TwoRelationConfig`.

    Example:
        >>> model = TwoRelationModel()
        >>> tokens, _ = make_two_relation_data(4)
        >>> logits, weights = model(tokens)
        >>> logits.shape, weights.shape
        (torch.Size([4, 10, 2, 8]), torch.Size([4, 2, 10, 10]))
    """

    def __init__(self, config: TwoRelationConfig | None = None) -> None:
        super().__init__()
        config = TwoRelationConfig() if config is None else config
        if not isinstance(config, TwoRelationConfig):
            raise TypeError(f"TwoRelationModel: config must be a TwoRelationConfig, got {type(config).__name__}")
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.embed_dim)
        self.register_buffer(
            "positions", rotating_position_code(config.seq_len, config.embed_dim), persistent=False
        )                                                                # [N, E]
        self.attention = MultiHeadAttention(config.embed_dim, config.num_heads)
        self.readout = nn.Sequential(                                   # two answers per position
            nn.Linear(config.embed_dim, config.hidden_dim),
            nn.ReLU(),
            nn.Linear(config.hidden_dim, len(RELATIONS) * config.vocab_size),
        )

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Predict every position's previous and first token; return the attention weights too.

        Args:
            tokens: ``[B, N]`` integers in ``[0, V)``, ``N <= config.seq_len``.

        Returns:
            ``(logits [B, N, 2, V], attention_weights [B, H, N, N])``; ``logits[:, :, 0]``
            scores the previous token, ``logits[:, :, 1]`` the first token.

        Raises:
            TypeError: ``tokens`` not an integer tensor.
            ValueError: not 2-D, longer than ``seq_len``, or a token outside the vocabulary.
        """
        where = "TwoRelationModel.forward"
        tokens = _validate.integer_tensor(where, "tokens", tokens)
        config = self.config
        if tokens.dim() != 2 or not 1 <= tokens.shape[1] <= config.seq_len:
            raise ValueError(
                f"{where}: tokens must be [B, N] with 1 <= N <= seq_len = {config.seq_len}, "
                f"got shape {_validate.shape_str(tokens)}"
            )
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= config.vocab_size):
            raise ValueError(
                f"{where}: tokens must lie in [0, {config.vocab_size}), got values from "
                f"{int(tokens.min())} to {int(tokens.max())}"
            )
        n = tokens.shape[1]
        x = self.token_embedding(tokens) + self.positions[:n]           # [B, N, E]
        mixed, weights = self.attention(x, is_causal=True)              # [B, N, E], [B, H, N, N]
        logits = self.readout(mixed).unflatten(-1, (len(RELATIONS), config.vocab_size))  # [B, N, 2, V]
        return logits, weights


def train_two_relation_model(
    steps: int = 400,
    seed: int = 0,
    *,
    config: TwoRelationConfig | None = None,
    batch_size: int = 64,
    lr: float = 1e-2,
) -> tuple[TwoRelationModel, torch.Tensor]:
    """Train a :class:`TwoRelationModel` with Adam on fresh random batches; deterministic.

    The seed fixes both the initial weights and the batches; the global random state is
    left as it was. About two seconds on a 2-core CPU with the defaults.

    Args:
        steps: optimisation steps (one new batch each).
        seed: the run's seed (>= 0).
        config: model sizes; defaults to ``TwoRelationConfig()``.
        batch_size: sequences per step.
        lr: Adam's learning rate.

    Returns:
        ``(model, losses)``: the trained model in eval mode and the training loss of every
        step, ``[steps]``: the cross-entropy averaged over both answers and positions
        ``1 … N-1``; guessing gives ``log V``.

    Raises:
        TypeError: arguments of the wrong type.
        ValueError: ``steps``/``batch_size`` below 1, a negative seed, or ``lr`` not a
            positive finite number.

    Example:
        >>> model, losses = train_two_relation_model(steps=400, seed=0)
        >>> bool(losses[-20:].mean() < 0.01)
        True
    """
    where = "train_two_relation_model"
    steps = _validate.integer(where, "steps", steps, minimum=1)
    seed = _validate.integer(where, "seed", seed, minimum=0)
    batch_size = _validate.integer(where, "batch_size", batch_size, minimum=1)
    lr = _validate.positive_finite(where, "lr", lr)
    config = TwoRelationConfig() if config is None else config
    if not isinstance(config, TwoRelationConfig):
        raise TypeError(f"{where}: config must be a TwoRelationConfig, got {type(config).__name__}")

    with torch.random.fork_rng(devices=[]):                              # keep the caller's RNG
        torch.manual_seed(seed)
        model = TwoRelationModel(config)
    batches = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = torch.empty(steps)                                          # [steps]
    model.train()
    for step in range(steps):
        tokens, targets = make_two_relation_data(
            batch_size, config.seq_len, config.vocab_size, generator=batches
        )                                                                # [B, N], [B, N, 2]
        logits, _ = model(tokens)                                        # [B, N, 2, V]
        loss = F.cross_entropy(logits.flatten(0, 2), targets.flatten(), ignore_index=IGNORE_INDEX)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses[step] = loss.detach()
    return model.eval(), losses


class RelationScores(NamedTuple):
    """Average attention of each head on the two relations, ``[H]`` each."""

    previous: torch.Tensor
    first: torch.Tensor


def head_relation_scores(attention_weights: torch.Tensor) -> RelationScores:
    """Per head, the average weight a query puts on the previous token and on the first token.

    Only queries at positions ``i >= 2`` count: at position 1 the previous token *is* the
    first one, and position 0 has no previous token.

    Args:
        attention_weights: ``[B, H, N, N]`` with ``N >= 3``, e.g. the second output of
            :class:`TwoRelationModel`.

    Returns:
        ``RelationScores(previous [H], first [H])``, each entry in ``[0, 1]`` for weights whose
        rows sum to 1.

    Raises:
        TypeError: not a floating tensor.
        ValueError: not ``[B, H, N, N]`` with ``N >= 3``.

    Example:
        >>> weights = torch.eye(4).roll(-1, dims=1)[None, None]     # each query looks one back
        >>> head_relation_scores(weights).previous
        tensor([1.])
    """
    where = "head_relation_scores"
    weights = _validate.floating_tensor(where, "attention_weights", attention_weights)
    if weights.dim() != 4 or weights.shape[-1] != weights.shape[-2] or weights.shape[-1] < 3:
        raise ValueError(
            f"{where}: attention_weights must be [B, H, N, N] with N >= 3, "
            f"got shape {_validate.shape_str(weights)}"
        )
    queries = torch.arange(2, weights.shape[-1], device=weights.device)   # [N - 2]
    previous = weights[:, :, queries, queries - 1].mean(dim=(0, 2))       # [H]
    first = weights[:, :, queries, 0].mean(dim=(0, 2))                    # [H]
    return RelationScores(previous=previous, first=first)


def steps_to_reach(losses: torch.Tensor, threshold: float) -> int | None:
    """The first step whose loss is below ``threshold``, or None if no step's is.

    Args:
        losses: ``[steps]``, one loss per training step (e.g. from :func:`train_two_relation_model`).
        threshold: a positive loss level.

    Returns:
        The index of the first entry ``< threshold``, or None.

    Raises:
        TypeError: ``losses`` not a floating tensor, or ``threshold`` not a number.
        ValueError: ``losses`` not 1-D and non-empty, or ``threshold`` not positive and finite.

    Example:
        >>> steps_to_reach(torch.tensor([2.0, 0.5, 0.05, 0.2, 0.01]), 0.1)
        2
        >>> steps_to_reach(torch.tensor([2.0, 0.5]), 0.1) is None
        True
    """
    where = "steps_to_reach"
    losses = _validate.floating_tensor(where, "losses", losses)
    threshold = _validate.positive_finite(where, "threshold", threshold)
    if losses.dim() != 1 or losses.numel() == 0:
        raise ValueError(f"{where}: losses must be 1-D [steps] and non-empty, got shape {_validate.shape_str(losses)}")
    below = (losses < threshold).nonzero()
    return int(below[0]) if len(below) else None


class HeadCountRun(NamedTuple):
    """One training run of :func:`compare_head_counts`.

    Attributes:
        seed: the run's seed.
        num_heads: ``H`` of its model.
        losses: ``[steps]``, the training loss of every step.
        steps_to_threshold: the first step whose loss fell below the threshold (None: never).
        final_loss: the mean loss of the last ``final_window`` steps (one step's loss is noisy:
            each step draws a new batch).
        previous, first: ``[H]``, each head's average weight on the previous and on the first
            token over fresh sequences (:func:`head_relation_scores`).
    """

    seed: int
    num_heads: int
    losses: torch.Tensor
    steps_to_threshold: int | None
    final_loss: float
    previous: torch.Tensor
    first: torch.Tensor


def compare_head_counts(
    seeds: Sequence[int],
    head_counts: Sequence[int] = (1, 2),
    *,
    steps: int = 100,
    threshold: float = 0.1,
    final_window: int = 10,
    probe_sequences: int = 512,
    probe_seed: int = 1,
) -> list[HeadCountRun]:
    """Train the two-relation model once per seed and head count, and summarise each run.

    Every run is :func:`train_two_relation_model` with the default sizes except ``num_heads``,
    so the runs of one seed share their batches and differ only in the model. The caller's
    random state is left as it was, and the same arguments give the same numbers.

    Args:
        seeds: the seeds to run (each >= 0).
        head_counts: the values of ``H`` to compare (each must divide the width, 32).
        steps: training steps per run.
        threshold: the loss level whose first crossing is reported.
        final_window: how many of the last steps ``final_loss`` averages (1 <= it <= steps).
        probe_sequences: how many fresh sequences measure where the heads look.
        probe_seed: the seed of those sequences.

    Returns:
        One :class:`HeadCountRun` per (seed, head count), seeds in the outer loop.

    Raises:
        TypeError: sequences that are not sequences of ints, or arguments of the wrong type.
        ValueError: empty sequences, a negative seed, a head count that does not divide the
            width, ``final_window`` outside ``[1, steps]``, or other values out of range.

    Example:
        >>> runs = compare_head_counts([0], steps=40)
        >>> [(run.num_heads, run.steps_to_threshold) for run in runs]
        [(1, None), (2, 27)]
    """
    where = "compare_head_counts"
    seeds = _validate.integer_sequence(where, "seeds", seeds, minimum=0)
    head_counts = _validate.integer_sequence(where, "head_counts", head_counts, minimum=1)
    if not seeds or not head_counts:
        raise ValueError(f"{where}: seeds and head_counts must not be empty")
    steps = _validate.integer(where, "steps", steps, minimum=1)
    threshold = _validate.positive_finite(where, "threshold", threshold)
    final_window = _validate.integer(where, "final_window", final_window, minimum=1)
    if final_window > steps:
        raise ValueError(f"{where}: final_window must be at most steps={steps}, got {final_window}")
    probe_sequences = _validate.integer(where, "probe_sequences", probe_sequences, minimum=1)
    probe_seed = _validate.integer(where, "probe_seed", probe_seed, minimum=0)
    configs = {}
    for heads in head_counts:
        try:
            configs[heads] = TwoRelationConfig(num_heads=heads)
        except ValueError as error:
            raise ValueError(f"{where}: head count {heads} does not fit the model: {error}") from None

    probe, _ = make_two_relation_data(probe_sequences, seed=probe_seed)        # [P, N]
    runs = []
    for seed in seeds:
        for heads in head_counts:
            model, losses = train_two_relation_model(steps, seed, config=configs[heads])
            with torch.no_grad():
                _, weights = model(probe)                                      # [P, H, N, N]
            scores = head_relation_scores(weights)
            runs.append(HeadCountRun(
                seed=seed, num_heads=heads, losses=losses,
                steps_to_threshold=steps_to_reach(losses, threshold),
                final_loss=losses[-final_window:].mean().item(),
                previous=scores.previous, first=scores.first,
            ))
    return runs
