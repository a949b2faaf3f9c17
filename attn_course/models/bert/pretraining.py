"""Masked-language-model pre-training of a small BERT, on a CPU.

BERT learned by filling in blanks (Devlin et al., 2019): 15 % of the ordinary tokens are chosen,
corrupted by the 80/10/10 rule of :func:`~attn_course.models.bert.mask_tokens`, and the loss is the
cross-entropy of the original token at the chosen positions only. This module trains the
course's own :class:`~attn_course.models.bert.BertModel`, with a small MLM head on top, that way::

    words = WordVocabulary.from_text(train_text)             # word-level, rare words -> [UNK]
    model = MaskedLanguageModel(config)                       # BertModel + MLM head (tied weights)
    logits = model(corrupted_ids, attention_mask)             # [B, N, V]
    loss = masked_lm_loss(logits, labels)                     # only where labels != -100

Words, not characters: the objective asks for a *word* at each blank, and a word is what a
reader can judge ("the cat and the [MASK]" -> "fiddle"). The price is a vocabulary of the words
seen at least ``min_count`` times in the training texts; the others become ``[UNK]``, which is
never asked for (a model could get it right without knowing anything).

Chapter 08 trains on :func:`~attn_course.data.stories.story_splits`: little stories from a small
grammar in which words far from a blank decide it, in three splits, one to train on, one to choose
the checkpoint (validation), one to report on (test). The nursery rhymes
(:func:`~attn_course.data.rhymes.load_pretraining_text`, :func:`~attn_course.data.rhymes.split_rhymes`)
work too.

One idea per module: the corpora (:mod:`attn_course.data.stories`, :mod:`attn_course.data.rhymes`), the
vocabulary and padding (:mod:`attn_course.data.tokenizers`), the head and the loss
(:mod:`attn_course.models.bert.masked_lm`), this training loop, the guesses to beat
(:mod:`attn_course.models.bert.baselines`) and what the model learned
(:mod:`attn_course.models.bert.evaluation`); the optimiser and its step are those of every training in
the course (:mod:`attn_course.models.training`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import time
from dataclasses import dataclass, field
from importlib import resources

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from attn_course import _validate
from attn_course._threads import one_thread
from attn_course.data.tokenizers import SPECIAL_TOKENS, WordVocabulary, pad_batch
from attn_course.models.bert.config import BertConfig
from attn_course.models.bert.masked_lm import MaskedLanguageModel, masked_lm_loss
from attn_course.models.bert.masking import mask_tokens
from attn_course.models.training import BestWeights, optimizer_step, warmed_up_adamw

__all__ = ["PretrainingConfig", "PretrainingHistory", "pretrain_mlm", "save_run", "load_saved_run", "SAVED_RUN"]

# Chapter 08's run, saved in the package's data by tools/train_small_bert.py.
SAVED_RUN = "small_bert_mlm.safetensors"


@dataclass(frozen=True)
class PretrainingConfig:
    """Sizes and settings of :func:`pretrain_mlm`; the defaults are chapter 08's, on its 2,000 training stories.

    Attributes:
        hidden_size, num_hidden_layers, num_attention_heads, intermediate_size: the encoder (``E``, ``L``,
            ``H``, ``F``).
        dropout: dropout of the encoder (hidden and attention).
        max_length: the longest sequence in tokens, ``[CLS]`` and ``[SEP]`` included; longer texts are
            cut into pieces.
        min_count: a word seen fewer times in the training texts becomes ``[UNK]``.
        steps, batch_size, learning_rate: AdamW, cosine-decayed learning rate, ``batch_size`` texts a step.
        probability: the share of ordinary tokens chosen (BERT: 0.15).
        eval_every: steps between two validation scorings.
        eval_corruptions: how many fixed choices of validation words to hide the validation loss averages.
        seed: seeds the weights, the batches, the corruption and the dropout.
    """

    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 128
    dropout: float = 0.0
    max_length: int = 32
    min_count: int = 2
    steps: int = 800
    batch_size: int = 64
    learning_rate: float = 5e-3
    probability: float = 0.15
    eval_every: int = 100
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
        eval_steps: after how many steps each validation loss was measured (0: before training).
        validation_losses: the MLM loss on the validation texts, every chosen word replaced by ``[MASK]``
            (mean over ``eval_corruptions`` fixed choices).
        unigram_loss: the same loss, on the same blanks, for a model that ignores the context and
            predicts the training words' frequencies.
        best_step: the entry of ``eval_steps`` with the lowest validation loss, whose weights the returned
            model holds (validation texts without a chosen word: None, and the last weights). Chosen on
            the validation texts, it is no fair score of them: report on a third, test split.
        seconds: the training's wall-clock time.
    """

    train_losses: list[float]
    eval_steps: list[int]
    validation_losses: list[float]
    unigram_loss: float
    best_step: int | None
    seconds: float = field(default=0.0, compare=False)


def _unigram_log_probs(vocab: WordVocabulary) -> torch.Tensor:
    """``[V]`` log-frequencies of the training words; special tokens get probability 0."""
    counts = torch.tensor([0] * len(SPECIAL_TOKENS) + vocab.counts, dtype=torch.float64)
    return (counts / counts.sum()).log().float()


def _bert_config(config: PretrainingConfig, vocab: WordVocabulary) -> BertConfig:
    """The encoder's sizes for ``config`` and a vocabulary."""
    return BertConfig(vocab_size=len(vocab), hidden_size=config.hidden_size,
                      num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
                      intermediate_size=config.intermediate_size, max_position_embeddings=config.max_length,
                      hidden_dropout_prob=config.dropout, attention_probs_dropout_prob=config.dropout,
                      pad_token_id=vocab.pad_id)


def _validation_loss(model: MaskedLanguageModel, validation: list, mask: torch.Tensor) -> float:
    """The MLM loss over every chosen word of the validation corruptions, in eval mode (training mode after)."""
    model.eval()
    with torch.no_grad():
        losses = [masked_lm_loss(model(m.input_ids, mask), m.labels) * m.chosen.sum() for m in validation]
    model.train()
    return float(sum(losses) / sum(m.chosen.sum() for m in validation))


def pretrain_mlm(
    train_texts: list[str],
    validation_texts: list[str],
    config: PretrainingConfig | None = None,
) -> tuple[MaskedLanguageModel, WordVocabulary, PretrainingHistory]:
    """Train a small BERT from scratch with the masked-language-model objective.

    Each step draws ``batch_size`` training texts, corrupts them with
    :func:`~attn_course.models.bert.mask_tokens` (``probability`` chosen, then 80/10/10; ``[PAD]``,
    ``[UNK]``, ``[CLS]``, ``[SEP]`` never chosen) and takes an AdamW step on
    :func:`masked_lm_loss`. Every ``eval_every`` steps the validation texts are scored under
    ``eval_corruptions`` fixed choices of ``probability`` of their words, each chosen word replaced
    by ``[MASK]`` (none left visible, so the score compares fairly with the unigram guess), and
    the weights with the lowest validation loss are the ones returned (a small model on little
    text soon starts to memorise). Runs on
    one CPU thread (faster for so small a model, and the same numbers on every run); the
    caller's random state is left as it was.

    Args:
        train_texts: the texts to train on (the vocabulary is built from them).
        validation_texts: texts to choose the checkpoint on, never trained on.
        config: a :class:`PretrainingConfig` (default: its defaults).

    Returns:
        ``(model, vocabulary, history)``: the model in eval mode, its :class:`WordVocabulary`, and a
        :class:`PretrainingHistory`.

    Raises:
        TypeError: texts that are not lists of str, or a config of another type.
        ValueError: no training or no validation text, or validation texts without a known word.

    Example:
        >>> rhymes = ["the cat sat on the mat in the hat"] * 8
        >>> config = PretrainingConfig(hidden_size=16, num_attention_heads=2, intermediate_size=32,
        ...                            steps=5, batch_size=8, eval_every=5)
        >>> model, vocab, history = pretrain_mlm(rhymes, rhymes[:2], config)
        >>> len(history.train_losses), history.eval_steps
        (5, [0, 5])
    """
    where = "pretrain_mlm"
    for name, rhymes in (("train_texts", train_texts), ("validation_texts", validation_texts)):
        if not isinstance(rhymes, list) or not all(isinstance(r, str) for r in rhymes):
            raise TypeError(f"{where}: {name} must be a list of str, got {type(rhymes).__name__}")
        if not rhymes:
            raise ValueError(f"{where}: {name} is empty")
    config = PretrainingConfig() if config is None else config
    if not isinstance(config, PretrainingConfig):
        raise TypeError(f"{where}: config must be a PretrainingConfig, got {type(config).__name__}")
    vocab = WordVocabulary.from_text(train_texts, min_count=config.min_count)
    train_pieces = vocab.encode_pieces(train_texts, config.max_length)
    valid_ids, valid_mask = pad_batch(vocab.encode_pieces(validation_texts, config.max_length), vocab.pad_id)  # [R, N]
    if not torch.isin(valid_ids, torch.tensor(vocab.special_ids), invert=True).any():
        raise ValueError(f"{where}: the validation texts hold no word of the training vocabulary")
    bert_config = _bert_config(config, vocab)

    def corrupt(ids: torch.Tensor, generator: torch.Generator):
        return mask_tokens(ids, mask_id=vocab.mask_id, vocab_size=len(vocab), special_ids=vocab.special_ids,
                           probability=config.probability, generator=generator)

    eval_generator = torch.Generator().manual_seed(config.seed + 1)
    validation = [corrupt(valid_ids, eval_generator) for _ in range(config.eval_corruptions)]
    # Scored with every chosen word hidden by [MASK]: the 10 % left visible by the 80/10/10 rule
    # would let the model copy the answer, which the unigram guess cannot do.
    validation = [m._replace(input_ids=torch.where(m.chosen, vocab.mask_id, valid_ids)) for m in validation
                  if m.chosen.any()]
    unigram = _unigram_log_probs(vocab)                                                   # [V]
    unigram_loss = (float(torch.cat([-unigram[m.labels[m.chosen]] for m in validation]).mean()) if validation
                    else math.nan)

    start = time.perf_counter()
    train_losses, best = [], BestWeights()
    batch_generator = torch.Generator().manual_seed(config.seed)
    with torch.random.fork_rng(devices=[]), one_thread(), torch.enable_grad():
        torch.manual_seed(config.seed)                                                 # the weights, the dropout
        model = MaskedLanguageModel(bert_config)
        with torch.no_grad():                     # start from the unigram guess: the context must earn its keep
            model.bias.copy_(unigram.clamp(min=-20.0))
        optimizer, schedule = warmed_up_adamw(model, config.learning_rate, warmup_steps=config.steps // 20,
                                              decay_steps=config.steps)
        if validation:
            best.record(0, _validation_loss(model, validation, valid_mask), model)
        model.train()
        for step in range(1, config.steps + 1):
            rows = torch.randint(len(train_pieces), (config.batch_size,), generator=batch_generator)
            ids, mask = pad_batch([train_pieces[r] for r in rows.tolist()], vocab.pad_id)  # [B, N]
            masked = corrupt(ids, batch_generator)
            if not masked.chosen.any():
                continue
            loss = masked_lm_loss(model(masked.input_ids, mask), masked.labels)
            train_losses.append(optimizer_step(loss, model, optimizer, schedule))
            if validation and (step % config.eval_every == 0 or step == config.steps):
                best.record(step, _validation_loss(model, validation, valid_mask), model)
        best.restore(model)
    model.eval()
    history = PretrainingHistory(train_losses, best.steps, best.losses, unigram_loss, best.best_step,
                                 seconds=time.perf_counter() - start)
    return model, vocab, history


def save_run(model: MaskedLanguageModel, vocab: WordVocabulary, history: PretrainingHistory,
             config: PretrainingConfig, path: str | pathlib.Path, *, texts: dict | None = None) -> None:
    """Write a :func:`pretrain_mlm` run to one safetensors file: the weights, and in its metadata the config,
    the vocabulary, the history and ``texts`` (what the run was trained on, for the reader).

    Raises:
        TypeError: arguments of the wrong kind. ValueError: a vocabulary that does not fit the model.
    """
    where = "save_run"
    for name, value, kind in (("model", model, MaskedLanguageModel), ("vocab", vocab, WordVocabulary),
                              ("history", history, PretrainingHistory), ("config", config, PretrainingConfig)):
        if not isinstance(value, kind):
            raise TypeError(f"{where}: {name} must be a {kind.__name__}, got {type(value).__name__}")
    if len(vocab) != model.config.vocab_size:
        raise ValueError(f"{where}: vocab has {len(vocab)} tokens but the model {model.config.vocab_size}")
    path = _validate.path(where, "path", path)
    state = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    record = dataclasses.asdict(history)
    record.pop("seconds")
    metadata = {"config": dataclasses.asdict(config), "words": vocab.words, "counts": vocab.counts,
                "history": record, "texts": texts or {}, "torch": torch.__version__}
    save_file(state, str(path), metadata={key: json.dumps(value, sort_keys=True) for key, value in metadata.items()})


def load_saved_run(path: str | pathlib.Path | None = None
                   ) -> tuple[MaskedLanguageModel, WordVocabulary, PretrainingHistory]:
    """The run a :func:`save_run` file holds: ``(model, vocabulary, history)``, the model in eval mode.

    With no ``path``, chapter 08's run, shipped in ``attn_course/data/`` (:data:`SAVED_RUN`, made by
    ``tools/train_small_bert.py``): what :func:`pretrain_mlm` gives with the default
    :class:`PretrainingConfig` on ``story_splits(train=2000, validation=200, test=200, seed=0)``, on the
    CPU that made it. A run on another CPU (other vectorised kernels) ends elsewhere in its last bits,
    and after 800 steps a little further: the saved run is what the chapter analyses.

    Raises:
        TypeError: ``path`` not a path. FileNotFoundError: no such file.
        ValueError: a file without the run's metadata, or whose weights do not fit its config.

    Example:
        >>> model, vocab, history = load_saved_run()
        >>> len(vocab), history.best_step, model.training
        (56, 800, False)
    """
    where = "load_saved_run"
    if path is None:
        path = pathlib.Path(str(resources.files("attn_course.data").joinpath(SAVED_RUN)))
    path = _validate.existing_file(where, "path", path, what="saved run")
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    missing = [key for key in ("config", "words", "counts", "history") if key not in metadata]
    if missing:
        raise ValueError(f"{where}: {path} has no {missing} in its metadata; was it written by save_run?")
    config = PretrainingConfig(**json.loads(metadata["config"]))
    vocab = WordVocabulary(json.loads(metadata["words"]), json.loads(metadata["counts"]))
    history = PretrainingHistory(**json.loads(metadata["history"]))
    model = MaskedLanguageModel(_bert_config(config, vocab))
    model.load_state_dict(load_file(str(path)), strict=True)
    return model.eval(), vocab, history
