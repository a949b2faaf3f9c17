"""Chapter 03's two-relation task: its data, its one-layer model and its training loop.

Sequences of random tokens; at every position the model names the previous token and the
first one (:data:`RELATIONS`). :mod:`~attn_course.teaching.experiments.toy_tasks` tells the
whole story and measures where the trained heads look.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from attn_course import _validate
from attn_course._threads import one_thread
from attn_course.core.multihead import MultiHeadAttention
from attn_course.models.training import optimizer_step

__all__ = [
    "IGNORE_INDEX",
    "RELATIONS",
    "TwoRelationConfig",
    "TwoRelationModel",
    "make_two_relation_data",
    "rotating_position_code",
    "train_two_relation_model",
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


def rotating_position_code(seq_len: int, embed_dim: int, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
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
        dtype: the result's floating type (computed in float64, then rounded to it).

    Returns:
        ``[N, E]`` of ``dtype``; row ``n`` codes position ``n``. Every row has norm ``√(E/2)``.

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
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{where}: dtype must be a floating torch.dtype, got {dtype!r}")
    pairs = embed_dim // 2
    frequencies = math.pi * (torch.arange(pairs, dtype=torch.float64) + 0.5) / pairs     # [K]
    angles = torch.arange(seq_len, dtype=torch.float64)[:, None] * frequencies        # [N, K]
    code = torch.stack([angles.cos(), angles.sin()], dim=-1)                           # [N, K, 2]
    return code.flatten(1).to(dtype)                                                   # [N, E]


@dataclasses.dataclass(frozen=True)
class TwoRelationConfig:
    """Sizes of :class:`TwoRelationModel`; the defaults train in about two seconds.

    Attributes:
        vocab_size: ``V``; chance-level loss is ``log V``.
        seq_len: ``N``, the longest sequence the position code covers (>= 3).
        embed_dim: ``E``, even and divisible by ``num_heads``.
        num_heads: ``H``.
        hidden_dim: width of the readout MLP.
        dtype: the parameters' and activations' floating type. float64 by default, because the
            training of one head is chaotic: in float32 the last bits of round-off, which
            differ between CPUs (their vector width, their BLAS kernels), change its loss
            curve after about 50 steps, so two machines print different losses. In float64
            that round-off is 2^29 times smaller, and the losses to three digits came out the
            same on every vector and BLAS code path tried (AVX2, AVX-512, MKL's "compatible").

    Raises:
        TypeError, ValueError: a field of the wrong type or out of range, named.
    """

    vocab_size: int = 8
    seq_len: int = 10
    embed_dim: int = 32
    num_heads: int = 2
    hidden_dim: int = 128
    dtype: torch.dtype = torch.float64

    def __post_init__(self) -> None:
        where = "TwoRelationConfig"
        _validate.integer(where, "vocab_size", self.vocab_size, minimum=2)
        _validate.integer(where, "seq_len", self.seq_len, minimum=3)
        _validate.integer(where, "embed_dim", self.embed_dim, minimum=2)
        _validate.integer(where, "num_heads", self.num_heads, minimum=1)
        _validate.integer(where, "hidden_dim", self.hidden_dim, minimum=1)
        if not isinstance(self.dtype, torch.dtype) or not self.dtype.is_floating_point:
            raise TypeError(f"{where}: dtype must be a floating torch.dtype such as torch.float64, got {self.dtype!r}")
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
        _validate.instance("TwoRelationModel", "config", config, TwoRelationConfig)
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.embed_dim)
        self.register_buffer(
            "positions", rotating_position_code(config.seq_len, config.embed_dim, dtype=config.dtype),
            persistent=False,
        )                                                                # [N, E]
        self.attention = MultiHeadAttention(config.embed_dim, config.num_heads)
        self.readout = nn.Sequential(                                   # two answers per position
            nn.Linear(config.embed_dim, config.hidden_dim),
            nn.ReLU(),
            nn.Linear(config.hidden_dim, len(RELATIONS) * config.vocab_size),
        )
        # Built in the default dtype, then converted: the initial weights are the same numbers
        # whatever config.dtype is.
        self.to(config.dtype)

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
    """Train a :class:`TwoRelationModel` with Adam (constant rate, no clipping) on fresh random batches; deterministic.

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
        >>> model, losses = train_two_relation_model(steps=30, seed=0)   # 400 steps learn both relations
        >>> losses.shape, bool(losses[-5:].mean() < losses[:5].mean())
        (torch.Size([30]), True)
    """
    where = "train_two_relation_model"
    steps = _validate.integer(where, "steps", steps, minimum=1)
    seed = _validate.integer(where, "seed", seed, minimum=0)
    batch_size = _validate.integer(where, "batch_size", batch_size, minimum=1)
    lr = _validate.positive_finite(where, "lr", lr)
    config = TwoRelationConfig() if config is None else config
    if not isinstance(config, TwoRelationConfig):
        raise TypeError(f"{where}: config must be a TwoRelationConfig, got {type(config).__name__}")

    # The caller's RNG is kept; one thread: these matrices are tiny, and waking a second thread for
    # each of them costs more than it saves (4x slower on 2 cores with OMP_WAIT_POLICY=PASSIVE).
    with torch.random.fork_rng(devices=[]), one_thread():
        torch.manual_seed(seed)
        model = TwoRelationModel(config)
    batches = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = torch.empty(steps, dtype=config.dtype)                      # [steps]
    model.train()
    for step in range(steps):
        tokens, targets = make_two_relation_data(
            batch_size, config.seq_len, config.vocab_size, generator=batches
        )                                                                # [B, N], [B, N, 2]
        logits, _ = model(tokens)                                        # [B, N, 2, V]
        loss = F.cross_entropy(logits.flatten(0, 2), targets.flatten(), ignore_index=IGNORE_INDEX)
        losses[step] = optimizer_step(loss, model, optimizer, max_norm=None)
    return model.eval(), losses
