"""Train short, test long: which position schemes survive inputs longer than training's?

Press, Smith and Lewis (2021), "Train Short, Test Long: Attention with Linear Biases Enables
Input Length Extrapolation" (arXiv 2108.12409), train language models on windows of ``L``
tokens and score them on longer ones. Their Figure 1 (WikiText-103, ``L`` = 512 and 1024):
as the validation input grows past ``L``, the perplexity of the sinusoidal, rotary and T5-bias
models gets worse, while that of ALiBi (their §3: no position embedding, a per-head penalty
``m_h · (i - j)`` on the scores) does not. Their default evaluation is *nonoverlapping*: the
text is cut into independent windows of the evaluation length, each scored on its own.

This module repeats the experiment at toy scale, on the course's nursery rhymes, in seconds of
CPU. One small causal character model takes one of four position schemes:

- ``"learned"``: an absolute embedding per position, added to the tokens (chapter 04's). The
  table is allocated for the longest evaluation length, but training only ever reads its first
  ``L`` rows: the others keep their random initial values (shrunk a little by AdamW's weight
  decay), which is exactly why learned positions cannot extrapolate.
- ``"rope"``: queries and keys rotated by their positions (chapter 05,
  ``MultiHeadAttention(rope=RotaryEmbedding(d))``); no position is added to the tokens.
- ``"alibi"``: no position anywhere but the bias ``m_h · (j - i)`` on every score, slopes from
  :func:`~attn_course.positions.alibi.alibi_slopes`.
- ``"none"``: no position information at all (the causal mask alone), the baseline.

:func:`length_extrapolation_experiment` trains each at ``L`` on ``nursery_rhymes.txt`` and
scores it with :func:`held_out_loss` on ``more_nursery_rhymes.txt`` (different rhymes) at 1×,
2×, 4× and 8× ``L``, every length on the same characters.

What the toy models show (the defaults: ``L`` = 32, ``E`` = 32, 4 heads, 2 layers, 200 steps of
16 windows, ``positions=POSITION_SCHEMES``; held-out loss in nats per character, the same 6400
characters at every length; torch 2.13 on a CPU, one thread)::

    position      N=32     N=64    N=128    N=256
    learned      2.447    2.537    2.621    2.653
    rope         2.289    2.477    2.698    2.830
    alibi        2.334    2.328    2.328    2.327
    none         2.419    2.436    2.451    2.465

At ``L`` RoPE is best, ALiBi close behind. Beyond ``L`` the learned model gets worse (its
untrained rows are noise added to the tokens; the damage is diluted because every window's
first ``L`` positions are still trained ones) and RoPE gets worse fastest: query-key offsets
beyond ``L - 1`` never occur in training, so the model meets rotations it never learned to
read. ALiBi stays flat and even improves a little, as in the paper's Figure 1; the model with
no positions degrades slowly. The models are tiny and briefly trained, so read the table as a
direction, not as the paper's numbers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from attn_course import _validate
from attn_course._threads import one_thread
from attn_course.data.rhymes import load_more_rhymes
from attn_course.data.tokenizers import CharTokenizer
from attn_course.models.position_model import POSITION_SCHEMES, train_position_model
from attn_course.models.training import mean_window_loss, nonoverlapping_windows

__all__ = ["encode_known", "held_out_loss", "ExtrapolationResult", "length_extrapolation_experiment",
           "plot_length_extrapolation"]


def encode_known(tokenizer: CharTokenizer, text: str) -> tuple[torch.Tensor, int]:
    """Encode ``text``, dropping the characters ``tokenizer`` has no id for.

    Args:
        tokenizer: a :class:`~attn_course.data.tokenizers.CharTokenizer`.
        text: any text.

    Returns:
        ``(ids [N], dropped)``: the ids of the known characters, in order, and how many
        characters were dropped.

    Raises:
        TypeError: ``tokenizer`` not a CharTokenizer, or ``text`` not a str.

    Example:
        >>> ids, dropped = encode_known(CharTokenizer("abc"), "cab!?a")
        >>> ids.tolist(), dropped
        ([2, 0, 1, 0], 2)
    """
    where = "encode_known"
    if not isinstance(tokenizer, CharTokenizer):
        raise TypeError(f"{where}: tokenizer must be a CharTokenizer, got {type(tokenizer).__name__}")
    if not isinstance(text, str):
        raise TypeError(f"{where}: text must be a str, got {type(text).__name__}")
    known = set(tokenizer.characters)
    kept = "".join(c for c in text if c in known)
    return tokenizer.encode(kept), len(text) - len(kept)


def held_out_loss(model: nn.Module, tokens: torch.Tensor, length: int) -> float:
    """Mean next-token cross-entropy over non-overlapping windows of ``length`` inputs.

    The paper's nonoverlapping evaluation: window ``w`` reads ``tokens[w·length : (w+1)·length]``
    and predicts each following token, so every token after the first is a target exactly once
    (as long as a whole window fits); the first token of each window is predicted without
    context, the last with ``length - 1`` tokens of it. A tail too short for a whole window is
    left out.

    Args:
        model: maps ``[B, N]`` ids to ``[B, N, V]`` logits (run in eval mode, without gradients).
        tokens: ``[T]`` integer ids, ``T > length``.
        length: the evaluation length ``N >= 1``.

    Returns:
        The mean loss in nats per character, a float.

    Raises:
        TypeError, ValueError: ``model`` not a module, ``tokens`` not a 1-D integer tensor
            longer than ``length``, or ``length`` not an int ``>= 1``.

    Example:
        >>> class Uniform(nn.Module):                       # each of 4 characters equally likely
        ...     def forward(self, ids):
        ...         return torch.zeros(*ids.shape, 4)
        >>> round(held_out_loss(Uniform(), torch.arange(9) % 4, length=4), 4)    # log 4
        1.3863
    """
    where = "held_out_loss"
    if not isinstance(model, nn.Module):
        raise TypeError(f"{where}: model must be a torch.nn.Module, got {type(model).__name__}")
    tokens = _validate.integer_tensor(where, "tokens", tokens)
    length = _validate.integer(where, "length", length, minimum=1)
    if tokens.dim() != 1 or len(tokens) <= length:
        raise ValueError(f"{where}: tokens must be [T] with T > length = {length}, got shape "
                         f"{_validate.shape_str(tokens)}")
    with one_thread():
        return mean_window_loss(model, nonoverlapping_windows(tokens, length))        # windows [W, N + 1]


@dataclass(frozen=True)
class ExtrapolationResult:
    """What :func:`length_extrapolation_experiment` measured.

    Attributes:
        rows: one dict per (scheme, length): ``{"position", "length", "factor", "loss"}``,
            ``loss`` in nats per character, rounded to 3 decimals.
        train_length: ``L``.
        scored_characters: how many characters every length scored (the same ones).
        dropped_characters: held-out characters missing from the training vocabulary, dropped.
        models: the trained model of each scheme, in eval mode, so that it can be studied further
            (chapter 09 streams the RoPE one through a cache with attention sinks).
        tokenizer: the character tokenizer all of them share (the training text's characters).
    """

    rows: list[dict]
    train_length: int
    scored_characters: int
    dropped_characters: int
    models: dict[str, nn.Module] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    tokenizer: CharTokenizer | None = dataclasses.field(default=None, repr=False, compare=False)

    def by_length(self) -> list[dict]:
        """One row per scheme, its loss at each evaluation length, ``{"position": ..., "N=32": ..., ...}``: what
        a chapter shows with :func:`attn_course.teaching.tables.table`."""
        wide: dict[str, dict] = {}
        for row in self.rows:
            wide.setdefault(row["position"], {"position": row["position"]})[f"N={row['length']}"] = row["loss"]
        return list(wide.values())


def length_extrapolation_experiment(
    positions: Sequence[str] = ("learned", "rope", "alibi"),
    *,
    train_length: int = 32,
    factors: Sequence[int] = (1, 2, 4, 8),
    steps: int = 200,
    seed: int = 0,
    **model_sizes: int,
) -> ExtrapolationResult:
    """Train each position scheme on windows of ``L``, score it at ``factor · L`` for each factor.

    Training text: :func:`~attn_course.data.rhymes.load_rhymes`; held-out text:
    :func:`load_more_rhymes`, its characters outside the training vocabulary dropped (counted
    in the result). Every evaluation length scores the same characters: the held-out ids are cut
    to ``1 + k · max(factors) · L``, the most whole windows of the longest length.

    Args:
        positions: the schemes to compare, from :data:`POSITION_SCHEMES`. Each costs about
            5 s of CPU with the defaults; ``"none"`` is left out of the default to keep the
            whole experiment near 15 s.
        train_length: ``L``.
        factors: evaluation lengths as multiples of ``L``, positive ints.
        steps: training steps per scheme.
        seed: the same for every scheme, so they start from the same batches.
        **model_sizes: ``embed_dim``, ``num_heads``, ``num_layers``, ``batch_size`` or
            ``learning_rate``, passed to :func:`train_position_model`.

    Returns:
        An :class:`ExtrapolationResult`; the same arguments give the same losses.

    Raises:
        TypeError, ValueError: an unknown scheme, ``train_length`` < 1, factors that are not
            positive ints (or none at all), or a held-out text shorter than one longest window.

    Example:
        >>> result = length_extrapolation_experiment(("alibi",), train_length=8, factors=(1, 2), steps=2)
        >>> [(row["length"], row["factor"]) for row in result.rows]
        [(8, 1), (16, 2)]
    """
    where = "length_extrapolation_experiment"
    positions = _validate.sequence(where, "positions", positions, of="position schemes")
    if not positions:
        raise ValueError(f"{where}: positions must name at least one scheme of {POSITION_SCHEMES}")
    for index, position in enumerate(positions):
        if position not in POSITION_SCHEMES:
            raise ValueError(f"{where}: positions[{index}] must be one of {POSITION_SCHEMES}, got {position!r}")
    train_length = _validate.integer(where, "train_length", train_length, minimum=1)
    factors = _validate.integer_sequence(where, "factors", factors, minimum=1)
    if not factors:
        raise ValueError(f"{where}: factors must hold at least one positive int")
    longest = max(factors) * train_length
    rows, scored, dropped, models = [], 0, 0, {}
    for position in positions:
        model, tokenizer = train_position_model(position, train_length=train_length, max_length=longest,
                                                steps=steps, seed=seed, **model_sizes)
        models[position] = model
        held_out, dropped = encode_known(tokenizer, load_more_rhymes())
        windows = (len(held_out) - 1) // longest
        if windows < 1:
            raise ValueError(f"{where}: the held-out text ({len(held_out)} characters) is shorter than one "
                             f"window of max(factors) * train_length + 1 = {longest + 1}")
        held_out = held_out[: windows * longest + 1]
        scored = windows * longest
        for factor in factors:
            loss = held_out_loss(model, held_out, factor * train_length)
            rows.append({"position": position, "length": factor * train_length, "factor": factor,
                         "loss": round(loss, 3)})
    return ExtrapolationResult(rows, train_length, scored, dropped, models, tokenizer)


def plot_length_extrapolation(result: ExtrapolationResult, ax=None):
    """Held-out loss against evaluation length, one line per position scheme, log₂ x axis.

    Args:
        result: from :func:`length_extrapolation_experiment`.
        ax: a matplotlib Axes to draw on (default: a new figure's).

    Returns:
        The Axes.

    Raises:
        TypeError: ``result`` not an ExtrapolationResult.
    """
    if not isinstance(result, ExtrapolationResult):
        raise TypeError(f"plot_length_extrapolation: result must be an ExtrapolationResult, "
                        f"got {type(result).__name__}")
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.5))
    for position in dict.fromkeys(row["position"] for row in result.rows):
        rows = [row for row in result.rows if row["position"] == position]
        ax.plot([r["length"] for r in rows], [r["loss"] for r in rows], marker="o", label=position)
    ax.set_xscale("log", base=2)
    lengths = sorted({row["length"] for row in result.rows})
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.axvline(result.train_length, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel(f"evaluation length N (trained at L = {result.train_length})")
    ax.set_ylabel("held-out loss (nats / character)")
    ax.set_title("Train short, test long")
    ax.legend()
    return ax
