"""Train short, test long (chapter 09): which position schemes survive inputs longer than training's?

Press, Smith and Lewis (2021), "Train Short, Test Long" (arXiv 2108.12409), train on windows of ``L`` tokens and
score longer ones, each text cut into independent windows of the evaluation length (*nonoverlapping*). In their
Figure 1 (WikiText-103, ``L`` = 512 and 1024) the sinusoidal, rotary and T5-bias models get worse past ``L``;
ALiBi (no position embedding, a per-head penalty ``m_h · (i - j)`` on the scores) does not.

Here at toy scale, in seconds of CPU: one small causal character model per scheme of
:data:`~attn_course.models.position_model.POSITION_SCHEMES` (``"learned"``: its table's rows past ``L`` are
never trained, which is why it cannot extrapolate; ``"rope"``; ``"alibi"``; ``"none"``, the causal mask alone),
trained at ``L`` on ``nursery_rhymes.txt`` and scored on ``more_nursery_rhymes.txt`` at 1×, 2×, 4× and 8× ``L``,
every length on the same characters. With the defaults (``L`` = 32, ``E`` = 32, 4 heads, 2 layers, 200 steps;
nats per character, torch 2.13, one CPU thread)::

    position      N=32     N=64    N=128    N=256
    learned      2.447    2.537    2.621    2.653
    rope         2.289    2.477    2.698    2.830
    alibi        2.334    2.328    2.328    2.327
    none         2.419    2.436    2.451    2.465

RoPE is best at ``L`` and gets worse fastest beyond it (offsets past ``L - 1`` never occur in training); ALiBi
stays flat, as in the paper. Tiny, briefly trained models: read the table as a direction.
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
    """Encode ``text`` with a :class:`~attn_course.data.tokenizers.CharTokenizer`, dropping the characters it has
    no id for; return ``(ids [N], dropped)``, the known characters' ids in order and how many were dropped.

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

    The paper's nonoverlapping evaluation: window ``w`` reads ``tokens[w·length : (w+1)·length]`` and predicts
    each following token, so every token after the first is a target once; the first of each window is
    predicted without context. A tail too short for a whole window is left out.

    Args:
        model: maps ``[B, N]`` ids to ``[B, N, V]`` logits (run in eval mode, without gradients).
        tokens: ``[T]`` integer ids, ``T > length``.
        length: the evaluation length ``N >= 1``.

    Returns:
        The mean loss in nats per character, a float.

    Raises:
        TypeError, ValueError: ``model`` not a module, ``tokens`` not a 1-D integer tensor longer than
            ``length``, or ``length`` not an int ``>= 1``.

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
        rows: one dict per (scheme, length): ``{"position", "length", "factor", "loss"}``, ``loss`` in nats
            per character, rounded to 3 decimals.
        train_length: ``L``.
        scored_characters, dropped_characters: the characters every length scored (the same ones), and the
            held-out characters missing from the training vocabulary, dropped.
        models, tokenizer: each scheme's trained model, in eval mode (chapter 09 streams the RoPE one through
            a cache with attention sinks), and the character tokenizer they share.
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


def length_extrapolation_experiment(positions: Sequence[str] = ("learned", "rope", "alibi"), *, train_length: int = 32,
                                    factors: Sequence[int] = (1, 2, 4, 8), steps: int = 200, seed: int = 0,
                                    **model_sizes: int) -> ExtrapolationResult:
    """Train each position scheme on windows of ``L`` (the rhymes), score it at ``factor · L`` for each factor.

    The held-out text is :func:`load_more_rhymes`, its characters outside the training vocabulary dropped.
    Every evaluation length scores the same characters: the held-out ids are cut to ``1 + k · max(factors) ·
    L``, the most whole windows of the longest length.

    Args:
        positions: schemes from :data:`POSITION_SCHEMES`, each about 5 s of CPU with the defaults (``"none"``
            is left out of the default to keep the whole near 15 s).
        train_length, factors: ``L``; evaluation lengths as multiples of ``L``, positive ints.
        steps: training steps per scheme.
        seed: the same for every scheme, so they start from the same batches.
        **model_sizes: ``embed_dim``, ``num_heads``, ``num_layers``, ``batch_size`` or ``learning_rate``, passed
            to :func:`train_position_model`.

    Returns:
        An :class:`ExtrapolationResult`; the same arguments give the same losses.

    Raises:
        TypeError, ValueError: an unknown scheme, ``train_length`` < 1, factors that are not positive ints (or
            none), or a held-out text shorter than one longest window.

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
    """Draw held-out loss against evaluation length, a line per scheme, log₂ x axis, on ``ax`` (default: a new
    figure's); return the Axes. Raises TypeError where ``result`` is not an :class:`ExtrapolationResult`."""
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
