"""Masked-language-model pre-training of a small BERT, on the course's nursery rhymes, on a CPU.

BERT learned by filling in blanks (Devlin et al., 2019): 15 % of the ordinary tokens are chosen,
corrupted by the 80/10/10 rule of :func:`~attn_course.models.bert.mask_tokens`, and the loss is the
cross-entropy of the original token at the chosen positions only. This module trains the
course's own :class:`~attn_course.models.bert.BertModel`, with a small MLM head on top, that way::

    words = WordVocabulary.from_text(train_text)             # word-level, rare words -> [UNK]
    model = MaskedLanguageModel(config)                       # BertModel + MLM head (tied weights)
    logits = model(corrupted_ids, attention_mask)             # [B, N, V]
    loss = masked_lm_loss(logits, labels)                     # only where labels != -100

Words, not characters: the objective asks for a *word* at each blank, and a word is what a
reader can judge ("the cat and the [MASK]" -> "fiddle"). The price is a small vocabulary of the
words seen at least twice in the training rhymes; the others become ``[UNK]``, which is never
asked for (a model could get it right without knowing anything).

The text is :func:`~attn_course.data.rhymes.load_pretraining_text`: the nursery rhymes of chapter 04
and a second file of traditional rhymes (both public domain), split rhyme by rhyme
(:func:`~attn_course.data.rhymes.split_rhymes`) so that no held-out rhyme is seen in training.

One idea per module: the corpus (:mod:`attn_course.data.rhymes`), the vocabulary and padding
(:mod:`attn_course.data.tokenizers`), the head and the loss (:mod:`attn_course.models.bert.masked_lm`),
this training loop, and what the model learned (:mod:`attn_course.models.bert.evaluation`). Chapter 07
imports all of them from here, so they are re-exported.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from attn_course import _validate
from attn_course._threads import one_thread
from attn_course.data.rhymes import load_pretraining_text, split_rhymes
from attn_course.data.tokenizers import SPECIAL_TOKENS, WordVocabulary, pad_batch
from attn_course.models.bert.config import BertConfig
from attn_course.models.bert.evaluation import MaskedWordAccuracy, masked_word_accuracy, top_predictions
from attn_course.models.bert.masked_lm import MaskedLanguageModel, masked_lm_loss
from attn_course.models.bert.masking import mask_tokens
from attn_course.models.training import BestWeights, clipped_step

__all__ = [
    "PretrainingConfig",
    "PretrainingHistory",
    "pretrain_mlm",
    # re-exported, for chapter 07's one import:
    "SPECIAL_TOKENS",
    "load_pretraining_text",
    "split_rhymes",
    "WordVocabulary",
    "pad_batch",
    "MaskedLanguageModel",
    "masked_lm_loss",
    "MaskedWordAccuracy",
    "masked_word_accuracy",
    "top_predictions",
]


@dataclass(frozen=True)
class PretrainingConfig:
    """Sizes and settings of :func:`pretrain_mlm`; the defaults train in about 20 s on one CPU core.

    Attributes:
        hidden_size, num_hidden_layers, num_attention_heads, intermediate_size: the encoder (``E``, ``L``,
            ``H``, ``F``).
        dropout: dropout of the encoder (hidden and attention).
        max_length: the longest sequence in tokens, ``[CLS]`` and ``[SEP]`` included; longer rhymes are
            cut into pieces.
        min_count: a word seen fewer times in the training rhymes becomes ``[UNK]``.
        steps, batch_size, learning_rate: AdamW, cosine-decayed learning rate, ``batch_size`` rhymes a step.
        probability: the share of ordinary tokens chosen (BERT: 0.15).
        eval_every: steps between two held-out scorings.
        eval_corruptions: how many fixed choices of held-out words to hide the held-out loss averages.
        seed: seeds the weights, the batches, the corruption and the dropout.
    """

    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 128
    dropout: float = 0.1
    max_length: int = 64
    min_count: int = 2
    steps: int = 300
    batch_size: int = 16
    learning_rate: float = 3e-3
    probability: float = 0.15
    eval_every: int = 25
    eval_corruptions: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        where = "PretrainingConfig"
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "min_count",
                     "steps", "batch_size", "eval_every", "eval_corruptions"):
            _validate.integer(where, name, getattr(self, name), minimum=1)
        _validate.integer(where, "max_length", self.max_length, minimum=3)
        _validate.integer(where, "seed", self.seed, minimum=0)
        _validate.dropout(where, self.dropout)
        _validate.positive_finite(where, "learning_rate", self.learning_rate)
        if isinstance(self.probability, bool) or not isinstance(self.probability, (int, float)) \
                or not 0 < self.probability <= 1:
            raise ValueError(f"{where}: probability must be a number in (0, 1], got {self.probability!r}")


@dataclass(frozen=True)
class PretrainingHistory:
    """What :func:`pretrain_mlm` measured.

    Attributes:
        train_losses: the MLM loss of each step's batch (a step whose batch drew no token to predict,
            possible only for tiny batches, is skipped).
        eval_steps: after how many steps each held-out loss was measured (0: before training).
        held_out_losses: the MLM loss on the held-out rhymes, every chosen word replaced by ``[MASK]``
            (mean over ``eval_corruptions`` fixed choices).
        unigram_loss: the same loss for a model that ignores the context and predicts the training
            words' frequencies: the line to beat.
        best_step: the entry of ``eval_steps`` with the lowest held-out loss, whose weights the returned
            model holds (held-out rhymes without a chosen word: None, and the last weights).
        seconds: the training's wall-clock time.
    """

    train_losses: list[float]
    eval_steps: list[int]
    held_out_losses: list[float]
    unigram_loss: float
    best_step: int | None
    seconds: float = field(default=0.0, compare=False)


def _unigram_log_probs(vocab: WordVocabulary) -> torch.Tensor:
    """``[V]`` log-frequencies of the training words; special tokens get probability 0."""
    counts = torch.tensor([0] * len(SPECIAL_TOKENS) + vocab.counts, dtype=torch.float64)
    return (counts / counts.sum()).log().float()


def _held_out_loss(model: MaskedLanguageModel, held_out: list, mask: torch.Tensor) -> float:
    """The MLM loss over every chosen word of the held-out corruptions, in eval mode (training mode after)."""
    model.eval()
    with torch.no_grad():
        losses = [masked_lm_loss(model(m.input_ids, mask), m.labels) * m.chosen.sum() for m in held_out]
    model.train()
    return float(sum(losses) / sum(m.chosen.sum() for m in held_out))


def pretrain_mlm(
    train_rhymes: list[str],
    held_out_rhymes: list[str],
    config: PretrainingConfig | None = None,
) -> tuple[MaskedLanguageModel, WordVocabulary, PretrainingHistory]:
    """Train a small BERT from scratch with the masked-language-model objective.

    Each step draws ``batch_size`` training rhymes, corrupts them with
    :func:`~attn_course.models.bert.mask_tokens` (``probability`` chosen, then 80/10/10; ``[PAD]``,
    ``[UNK]``, ``[CLS]``, ``[SEP]`` never chosen) and takes an AdamW step on
    :func:`masked_lm_loss`. Every ``eval_every`` steps the held-out rhymes are scored under
    ``eval_corruptions`` fixed choices of ``probability`` of their words, each chosen word replaced
    by ``[MASK]`` (none left visible, so the score compares fairly with the unigram guess), and
    the weights with the lowest held-out loss are the ones returned (a model this size on so
    little text soon starts to memorise). Runs on
    one CPU thread (faster for so small a model, and the same numbers on every run); the
    caller's random state is left as it was.

    Args:
        train_rhymes: the texts to train on (the vocabulary is built from them).
        held_out_rhymes: texts to score the model on, never trained on.
        config: a :class:`PretrainingConfig` (default: its defaults).

    Returns:
        ``(model, vocabulary, history)``: the model in eval mode, its :class:`WordVocabulary`, and a
        :class:`PretrainingHistory`.

    Raises:
        TypeError: rhymes that are not lists of str, or a config of another type.
        ValueError: no training or no held-out rhyme, or held-out rhymes without a known word.

    Example:
        >>> rhymes = ["the cat sat on the mat in the hat"] * 8
        >>> config = PretrainingConfig(hidden_size=16, num_attention_heads=2, intermediate_size=32,
        ...                            steps=5, batch_size=8, eval_every=5)
        >>> model, vocab, history = pretrain_mlm(rhymes, rhymes[:2], config)
        >>> len(history.train_losses), history.eval_steps
        (5, [0, 5])
    """
    where = "pretrain_mlm"
    for name, rhymes in (("train_rhymes", train_rhymes), ("held_out_rhymes", held_out_rhymes)):
        if not isinstance(rhymes, list) or not all(isinstance(r, str) for r in rhymes):
            raise TypeError(f"{where}: {name} must be a list of str, got {type(rhymes).__name__}")
        if not rhymes:
            raise ValueError(f"{where}: {name} is empty")
    config = PretrainingConfig() if config is None else config
    if not isinstance(config, PretrainingConfig):
        raise TypeError(f"{where}: config must be a PretrainingConfig, got {type(config).__name__}")
    vocab = WordVocabulary.from_text(train_rhymes, min_count=config.min_count)
    train_pieces = vocab.encode_pieces(train_rhymes, config.max_length)
    held_ids, held_mask = pad_batch(vocab.encode_pieces(held_out_rhymes, config.max_length), vocab.pad_id)  # [R, N]
    if not torch.isin(held_ids, torch.tensor(vocab.special_ids), invert=True).any():
        raise ValueError(f"{where}: the held-out rhymes hold no word of the training vocabulary")
    bert_config = BertConfig(vocab_size=len(vocab), hidden_size=config.hidden_size,
                             num_hidden_layers=config.num_hidden_layers,
                             num_attention_heads=config.num_attention_heads,
                             intermediate_size=config.intermediate_size, max_position_embeddings=config.max_length,
                             hidden_dropout_prob=config.dropout, attention_probs_dropout_prob=config.dropout,
                             pad_token_id=vocab.pad_id)

    def corrupt(ids: torch.Tensor, generator: torch.Generator):
        return mask_tokens(ids, mask_id=vocab.mask_id, vocab_size=len(vocab), special_ids=vocab.special_ids,
                           probability=config.probability, generator=generator)

    eval_generator = torch.Generator().manual_seed(config.seed + 1)
    held_out = [corrupt(held_ids, eval_generator) for _ in range(config.eval_corruptions)]
    # Scored with every chosen word hidden by [MASK]: the 10 % left visible by the 80/10/10 rule
    # would let the model copy the answer, which the unigram guess cannot do.
    held_out = [m._replace(input_ids=torch.where(m.chosen, vocab.mask_id, held_ids)) for m in held_out
                if m.chosen.any()]
    unigram = _unigram_log_probs(vocab)                                                   # [V]
    unigram_loss = float(torch.cat([-unigram[m.labels[m.chosen]] for m in held_out]).mean()) if held_out else math.nan

    start = time.perf_counter()
    train_losses, best = [], BestWeights()
    batch_generator = torch.Generator().manual_seed(config.seed)
    with torch.random.fork_rng(devices=[]), one_thread(), torch.enable_grad():
        torch.manual_seed(config.seed)                                                 # the weights, the dropout
        model = MaskedLanguageModel(bert_config)
        with torch.no_grad():                     # start from the unigram guess: the context must earn its keep
            model.bias.copy_(unigram.clamp(min=-20.0))
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.01)
        warmup = max(1, config.steps // 20)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(
            (step + 1) / warmup, 0.5 * (1 + math.cos(math.pi * step / config.steps))))
        if held_out:
            best.record(0, _held_out_loss(model, held_out, held_mask), model)
        model.train()
        for step in range(1, config.steps + 1):
            rows = torch.randint(len(train_pieces), (config.batch_size,), generator=batch_generator)
            ids, mask = pad_batch([train_pieces[r] for r in rows.tolist()], vocab.pad_id)  # [B, N]
            masked = corrupt(ids, batch_generator)
            if not masked.chosen.any():
                continue
            loss = masked_lm_loss(model(masked.input_ids, mask), masked.labels)
            train_losses.append(clipped_step(loss, model, optimizer, schedule))
            if held_out and (step % config.eval_every == 0 or step == config.steps):
                best.record(step, _held_out_loss(model, held_out, held_mask), model)
        best.restore(model)
    model.eval()
    history = PretrainingHistory(train_losses, best.steps, best.losses, unigram_loss, best.best_step,
                                 seconds=time.perf_counter() - start)
    return model, vocab, history
