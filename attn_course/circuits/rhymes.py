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

from attn_course import _validate
from attn_course._threads import one_thread
from attn_course.circuits.losses import token_losses
from attn_course.circuits.recording import record_patterns
from attn_course.circuits.scores import induction_score, previous_token_score
from attn_course.circuits.training import EVALUATION_SEED, state_digest, warmed_up_adamw
from attn_course.data.repeated_tokens import character_windows, repeated_random_tokens
from attn_course.data.rhymes import held_out_split, load_pretraining_text, load_rhymes
from attn_course.data.tokenizers import CharTokenizer
from attn_course.models.attention_only import AttentionOnlyTransformer
from attn_course.models.training import clipped_step, nonoverlapping_windows

__all__ = ["RhymesSetup", "RhymesHistory", "rhymes_tokenizer", "train_rhymes_model"]


@dataclass(frozen=True)
class RhymesSetup:
    """Sizes and schedule of :func:`train_rhymes_model`.

    Attributes:
        length: ``N``, characters per training window (and the model's ``max_len``).
        half_length: the period of the repeated random characters the scores are read on (``2·half_length ≤ N``).
        n_layers, n_heads, d_model, positions, layer_norm: the model.
        batch_size, learning_rate, warmup_steps, weight_decay: the schedule (AdamW, clipped to norm 1).
        held_out_fraction: the tail of the text scored and not trained on.
        evaluation_batch: repeated random sequences the scores are averaged over.
        corpus: ``"all"`` (:func:`~attn_course.data.rhymes.load_pretraining_text`, both rhyme files, ~14 KB)
            or ``"rhymes"`` (:func:`~attn_course.data.rhymes.load_rhymes`, ~6 KB; a 64-wide model memorises it,
            its held-out loss rising after ~250 steps).
    """

    length: int = 128
    half_length: int = 32
    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 64
    positions: str = "learned"
    layer_norm: bool = False
    batch_size: int = 32
    learning_rate: float = 1e-3
    warmup_steps: int = 50
    weight_decay: float = 0.01
    held_out_fraction: float = 0.1
    evaluation_batch: int = 64
    corpus: str = "all"


@dataclass
class RhymesHistory:
    """What :func:`train_rhymes_model` measured at each recorded step (JSON-ready lists).

    Attributes:
        seed, setup: how the run was made.
        steps: optimiser steps at each record.
        held_out_loss: mean next-character loss on the held-out rhymes (nats).
        repeated_loss: on repeated random characters, the loss of the predictable tokens of the repeat.
        induction_scores, previous_token_scores: ``[layer][head]`` on repeated random characters.
        train_loss: mean training loss since the previous record (None at step 0).
        digests: SHA-256 of the weights at each record.
    """

    seed: int
    setup: dict
    steps: list[int] = field(default_factory=list)
    held_out_loss: list[float] = field(default_factory=list)
    repeated_loss: list[float] = field(default_factory=list)
    induction_scores: list[list[list[float]]] = field(default_factory=list)
    previous_token_scores: list[list[list[float]]] = field(default_factory=list)
    train_loss: list[float | None] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        """Plain dict for JSON (``RhymesHistory(**d)`` rebuilds it)."""
        return dataclasses.asdict(self)


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
    seed = _validate.integer(where, "seed", seed, minimum=0)
    steps = _validate.integer(where, "steps", steps, minimum=1)
    record_every = _validate.integer(where, "record_every", record_every, minimum=1)
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
    with one_thread(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AttentionOnlyTransformer(tokenizer.vocab_size, n_layers=setup.n_layers, n_heads=setup.n_heads,
                                         d_model=setup.d_model, max_len=setup.length, positions=setup.positions,
                                         layer_norm=setup.layer_norm)
        batches = torch.Generator().manual_seed(seed + 1_000_003)
        optimizer, schedule = warmed_up_adamw(model, setup)
        history = RhymesHistory(seed=seed, setup=dataclasses.asdict(setup))
        since: list[float] = []

        def keep(step: int) -> None:
            patterns = record_patterns(model, repeated)                          # {layer: [B, H, N, N]}
            history.steps.append(step)
            history.held_out_loss.append(token_losses(model, held_out).mean().item())
            history.repeated_loss.append(token_losses(model, repeated)[:, half:].mean().item())   # tokens L+1 ..
            history.induction_scores.append([induction_score(p, half).mean(0).tolist() for p in patterns.values()])
            history.previous_token_scores.append([previous_token_score(p).mean(0).tolist()
                                                  for p in patterns.values()])
            history.train_loss.append(sum(since) / len(since) if since else None)
            history.digests.append(state_digest(model))
            since.clear()

        keep(0)
        model.train()
        for step in range(1, steps + 1):
            window = character_windows(train_ids, setup.batch_size, setup.length + 1, generator=batches)  # [B, N+1]
            logits = model(window[:, :-1])                                       # [B, N, V]
            loss = F.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten())
            since.append(clipped_step(loss, model, optimizer, schedule))
            if step % record_every == 0 or step == steps:
                keep(step)
    return model.eval(), history
