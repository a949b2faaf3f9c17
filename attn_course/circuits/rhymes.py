"""The second dataset of chapter 11: an attention-only model trained on the course's rhymes, character by character.

Natural text repeats itself ("Twinkle, twinkle", refrains, rhyming endings), so induction heads can pay
there too. :func:`train_rhymes_model` trains an :class:`~attn_course.models.attention_only.AttentionOnlyTransformer`
on random windows of :func:`~attn_course.data.rhymes.load_rhymes` (its held-out tail scored, not trained on)
and records, as :func:`~attn_course.circuits.training.train_induction_model` does, every head's induction and
previous-token scores, here on repeated random *characters*. Deterministic for a seed on a CPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from attn_course.circuits.losses import token_losses
from attn_course.circuits.recording import record_patterns
from attn_course.circuits.scores import induction_score, previous_token_score
from attn_course.circuits.training import EVALUATION_SEED, AttentionOnlySetup, RecordedHistory, train_and_record
from attn_course.data.repeated_tokens import character_windows, repeated_random_tokens
from attn_course.data.rhymes import held_out_split, load_pretraining_text, load_rhymes
from attn_course.data.tokenizers import CharTokenizer
from attn_course.models.attention_only import AttentionOnlyTransformer
from attn_course.models.training import nonoverlapping_windows

__all__ = ["RhymesSetup", "RhymesHistory", "rhymes_tokenizer", "train_rhymes_model"]


@dataclass(frozen=True)
class RhymesSetup(AttentionOnlySetup):
    """:func:`train_rhymes_model`'s setup: :class:`~attn_course.circuits.training.AttentionOnlySetup` (at a
    learning rate of 1e-3) and the text.

    Attributes:
        length: ``N``, characters per training window (and the model's ``max_len``).
        half_length: the period of the repeated random characters the scores are read on (``2·half_length ≤ N``).
        held_out_fraction: the tail of the text scored and not trained on.
        corpus: ``"all"`` (:func:`~attn_course.data.rhymes.load_pretraining_text`, both rhyme files, ~14 KB)
            or ``"rhymes"`` (:func:`~attn_course.data.rhymes.load_rhymes`, ~6 KB; a 64-wide model memorises it,
            its held-out loss rising after ~250 steps).
    """

    learning_rate: float = 1e-3
    length: int = 128
    half_length: int = 32
    held_out_fraction: float = 0.1
    corpus: str = "all"


@dataclass
class RhymesHistory(RecordedHistory):
    """What :func:`train_rhymes_model` measured: :class:`~attn_course.circuits.training.RecordedHistory`'s lists,
    the scores and ``repeated_loss`` on repeated random characters, and the held-out rhymes' loss.

    Attributes:
        held_out_loss: mean next-character loss on the held-out rhymes (nats).
    """

    held_out_loss: list[float] = field(default_factory=list)


def rhymes_tokenizer() -> CharTokenizer:
    """The character tokenizer of both rhyme files (:func:`~attn_course.data.rhymes.load_pretraining_text`)."""
    return CharTokenizer(load_pretraining_text())


def train_rhymes_model(seed: int, steps: int = 1500, *, setup: RhymesSetup | None = None,
                       record_every: int = 100) -> tuple[AttentionOnlyTransformer, RhymesHistory]:
    """Train an attention-only model on the rhymes' characters, scoring its heads every ``record_every`` steps.

    Args:
        seed: an int ≥ 0 (weights and batches).
        steps: optimiser steps, at least 1.
        setup: a :class:`RhymesSetup` (default its defaults).
        record_every: at least 1.

    Returns:
        ``(model, history)``, the model in eval mode; its vocabulary is :func:`rhymes_tokenizer`'s.

    Raises:
        TypeError: ints of the wrong kind, a ``setup`` of another kind.
        ValueError: ``seed`` below 0, ``steps`` or ``record_every`` below 1, ``2·half_length > length``.

    Example:
        >>> model, history = train_rhymes_model(0, steps=2, record_every=1)
        >>> history.steps
        [0, 1, 2]
    """
    where = "train_rhymes_model"
    setup = RhymesSetup() if setup is None else setup
    if not isinstance(setup, RhymesSetup):
        raise TypeError(f"{where}: setup must be a RhymesSetup or None, got {type(setup).__name__}")
    if 2 * setup.half_length > setup.length:
        raise ValueError(f"{where}: 2 * half_length = {2 * setup.half_length} must fit length = {setup.length}")
    tokenizer = rhymes_tokenizer()
    if setup.corpus not in ("rhymes", "all"):
        raise ValueError(f"{where}: setup.corpus must be 'rhymes' or 'all', got {setup.corpus!r}")
    text = load_rhymes() if setup.corpus == "rhymes" else load_pretraining_text()
    train_text, held_text = held_out_split(text, setup.held_out_fraction)
    train_ids = tokenizer.encode(train_text)                                     # [T]
    held_out = nonoverlapping_windows(tokenizer.encode(held_text), setup.length - 1)   # [W, N]
    repeated = repeated_random_tokens(setup.evaluation_batch, setup.half_length, tokenizer.vocab_size,
                                      generator=torch.Generator().manual_seed(EVALUATION_SEED))   # [B, 2L]
    half = setup.half_length

    def batch_loss(model: torch.nn.Module, batches: torch.Generator) -> torch.Tensor:
        window = character_windows(train_ids, setup.batch_size, setup.length + 1, generator=batches)   # [B, N+1]
        logits = model(window[:, :-1])                                           # [B, N, V]
        return F.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten())

    def measure(model: torch.nn.Module) -> dict:
        patterns = record_patterns(model, repeated)                              # {layer: [B, H, N, N]}
        return {
            "held_out_loss": token_losses(model, held_out).mean().item(),
            "repeated_loss": token_losses(model, repeated)[:, half:].mean().item(),   # tokens L+1 ..
            "induction_scores": [induction_score(p, half).mean(0).tolist() for p in patterns.values()],
            "previous_token_scores": [previous_token_score(p).mean(0).tolist() for p in patterns.values()],
        }

    history = RhymesHistory(seed=seed, setup=dataclasses.asdict(setup))
    model = train_and_record(seed, steps, record_every, setup, history, batch_loss=batch_loss, measure=measure,
                             build_model=lambda: setup.build_model(tokenizer.vocab_size, setup.length), caller=where)
    return model, history
