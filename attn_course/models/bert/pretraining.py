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

The text is :func:`load_pretraining_text`: the nursery rhymes of chapter 04 and a second file of
traditional rhymes (both public domain), split rhyme by rhyme so that no held-out rhyme is seen
in training.
"""

from __future__ import annotations

import collections
import copy
import math
import re
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from attn_course import _validate
from attn_course._threads import one_thread
from attn_course.data.rhymes import held_out_split, load_more_rhymes, load_rhymes
from attn_course.models.bert.config import BertConfig
from attn_course.models.bert.mlm import IGNORE_INDEX, mask_tokens
from attn_course.models.bert.model import BertModel

__all__ = [
    "SPECIAL_TOKENS",
    "load_pretraining_text",
    "split_rhymes",
    "WordVocabulary",
    "MaskedLanguageModel",
    "masked_lm_loss",
    "PretrainingConfig",
    "PretrainingHistory",
    "MaskedWordAccuracy",
    "pad_batch",
    "pretrain_mlm",
    "masked_word_accuracy",
    "top_predictions",
]

#: The special tokens, in the order of their ids 0..4.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def load_pretraining_text() -> str:
    """The text the small BERT is trained on: chapter 04's rhymes, then more traditional rhymes.

    Both files hold traditional English nursery rhymes, public domain (collected in print since the
    18th and 19th centuries; "Three Little Kittens" is Eliza Lee Follen's, 1843, and "The Owl and
    the Pussy-cat" Edward Lear's, 1871). Rhymes are separated by a blank line; about 14 KB.

    Returns:
        The text of ``data/nursery_rhymes.txt`` and ``data/more_nursery_rhymes.txt``, joined by a
        blank line.
    """
    return load_rhymes().rstrip("\n") + "\n\n" + load_more_rhymes()


def split_rhymes(text: str, held_out_fraction: float = 0.1) -> tuple[list[str], list[str]]:
    """Split a text into rhymes (blank-line separated) to train on and rhymes held out.

    The last ``held_out_fraction`` of the characters, moved back to a blank line
    (:func:`~attn_course.data.rhymes.held_out_split`), is held out, so a rhyme is wholly on
    one side.

    Args:
        text: rhymes separated by blank lines.
        held_out_fraction: in ``[0, 1)``.

    Returns:
        ``(train_rhymes, held_out_rhymes)``: two lists of non-empty strings.

    Raises:
        TypeError: ``text`` not a str. ValueError: ``held_out_fraction`` outside ``[0, 1)``.

    Example:
        >>> split_rhymes("a b\\n\\nc d\\n\\ne f", held_out_fraction=0.2)
        (['a b', 'c d'], ['e f'])
    """
    train, held_out = held_out_split(text, held_out_fraction)

    def rhymes(part: str) -> list[str]:
        return [r.strip() for r in part.split("\n\n") if r.strip()]

    return rhymes(train), rhymes(held_out)


class WordVocabulary:
    """Lower-cased words to ids and back; the five :data:`SPECIAL_TOKENS` take ids 0..4.

    A word is a run of letters, with one apostrophe inside ("king's", "couldn't"); punctuation is
    dropped. Words seen fewer than ``min_count`` times when the vocabulary is built map to
    ``[UNK]``.

    Args:
        words: the ordinary words, most frequent first (ids 5, 6, ...).
        counts: how often each of ``words`` was seen (for the unigram baseline).

    Example:
        >>> vocab = WordVocabulary.from_text("the cat and the hat and the bat", min_count=2)
        >>> vocab.words, vocab.encode("The cat, the hat!").tolist()
        (['the', 'and'], [5, 1, 5, 1])
    """

    pad_id, unk_id, cls_id, sep_id, mask_id = range(5)

    def __init__(self, words: list[str], counts: list[int]) -> None:
        where = "WordVocabulary"
        words = list(_validate.sequence(where, "words", words, of="words"))
        counts = _validate.integer_sequence(where, "counts", counts, minimum=0)
        if len(words) != len(counts):
            raise ValueError(f"{where}: words and counts must have the same length, got {len(words)} and {len(counts)}")
        if len(set(words)) != len(words) or any(not isinstance(w, str) or w in SPECIAL_TOKENS for w in words):
            raise ValueError(f"{where}: words must be distinct strings other than {SPECIAL_TOKENS}")
        self.words = words
        self.counts = counts
        self.tokens = list(SPECIAL_TOKENS) + words
        self.index = {token: i for i, token in enumerate(self.tokens)}

    @classmethod
    def from_text(cls, text: str | list[str], *, min_count: int = 2) -> WordVocabulary:
        """Build the vocabulary of ``text`` (a str or a list of str): the words seen ``min_count`` times or more."""
        where = "WordVocabulary.from_text"
        text = _text(where, text)
        min_count = _validate.integer(where, "min_count", min_count, minimum=1)
        counter = collections.Counter(_WORD.findall(text.lower()))
        kept = sorted((w for w, c in counter.items() if c >= min_count), key=lambda w: (-counter[w], w))
        return cls(kept, [counter[w] for w in kept])

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def special_ids(self) -> list[int]:
        """``[PAD]``, ``[UNK]``, ``[CLS]``, ``[SEP]`` (and ``[MASK]``): never chosen as a target."""
        return [self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id]

    def split(self, text: str) -> list[str]:
        """The lower-cased words of ``text``, punctuation dropped."""
        return _WORD.findall(_text("WordVocabulary.split", text).lower())

    def encode(self, text: str, *, add_special: bool = False) -> torch.Tensor:
        """``[N]`` ids of the words of ``text`` (``[CLS] ... [SEP]`` around them with ``add_special``)."""
        ids = [self.index.get(w, self.unk_id) for w in self.split(text)]
        if add_special:
            ids = [self.cls_id, *ids, self.sep_id]
        return torch.tensor(ids, dtype=torch.long)

    def decode(self, ids: torch.Tensor | list[int]) -> list[str]:
        """The token of each id."""
        if isinstance(ids, torch.Tensor):
            ids = _validate.integer_tensor("WordVocabulary.decode", "ids", ids).flatten().tolist()
        ids = _validate.integer_sequence("WordVocabulary.decode", "ids", ids, minimum=0)
        if any(i >= len(self.tokens) for i in ids):
            raise ValueError(f"WordVocabulary.decode: ids must be below {len(self.tokens)}")
        return [self.tokens[i] for i in ids]


def _text(where: str, text: object) -> str:
    if isinstance(text, list) and all(isinstance(t, str) for t in text):
        return "\n\n".join(text)
    if not isinstance(text, str):
        raise TypeError(f"{where}: text must be a str (or a list of str), got {type(text).__name__}")
    return text


class MaskedLanguageModel(nn.Module):
    """A :class:`~attn_course.models.bert.BertModel` with BERT's MLM head: a score for every token at every position.

    The head is BERT's: ``Linear(E, E) → GELU → LayerNorm``, then a product with the token
    embedding table (the output layer shares its weights with the input embeddings, as in BERT)
    plus a bias per token.

    Args:
        config: a :class:`~attn_course.models.bert.BertConfig`.

    Raises:
        TypeError: ``config`` not a ``BertConfig``.

    Example:
        >>> config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
        ...                     num_attention_heads=2, intermediate_size=32)
        >>> MaskedLanguageModel(config)(torch.tensor([[2, 7, 4, 3]])).shape            # [B, N, V]
        torch.Size([1, 4, 50])
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.encoder = BertModel(config)          # raises TypeError for a config of another type
        self.config = config
        self.transform = nn.Linear(config.hidden_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        for module in self.modules():                        # BERT's initialisation: N(0, 0.02), zero biases
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, N]`` ids (and a ``[B, N]`` padding mask, 1 = real token) to ``[B, N, V]`` scores.

        Raises the errors of :meth:`BertModel.forward` for ids or masks of the wrong kind.
        """
        hidden = self.encoder(input_ids, attention_mask, output_attentions=False).last_hidden_state  # [B, N, E]
        hidden = self.norm(F.gelu(self.transform(hidden)))                                          # [B, N, E]
        return hidden @ self.encoder.embeddings.word.weight.T + self.bias                            # [B, N, V]


def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The MLM loss: mean cross-entropy over the chosen positions only (labels other than -100).

    Args:
        logits: ``[B, N, V]`` scores.
        labels: ``[B, N]`` integer ids, :data:`~attn_course.models.bert.IGNORE_INDEX` (-100) where no
            token is predicted (what :func:`~attn_course.models.bert.mask_tokens` returns).

    Returns:
        A scalar tensor: ``mean over {(b, i): labels[b, i] != -100} of -log softmax(logits[b, i])[labels[b, i]]``.

    Raises:
        TypeError: ``logits`` not floating or ``labels`` not integer.
        ValueError: shapes that do not match, labels out of ``0..V-1`` (other than -100), or no
            chosen position at all (the mean would be 0/0).

    Example:
        >>> logits = torch.zeros(1, 3, 4)
        >>> masked_lm_loss(logits, torch.tensor([[-100, 2, -100]]))     # log 4
        tensor(1.3863)
    """
    where = "masked_lm_loss"
    logits = _validate.floating_tensor(where, "logits", logits)
    labels = _validate.integer_tensor(where, "labels", labels)
    if logits.dim() != 3 or labels.shape != logits.shape[:2]:
        raise ValueError(f"{where}: logits must be [B, N, V] and labels [B, N], got {_validate.shape_str(logits)} "
                         f"and {_validate.shape_str(labels)}")
    chosen = labels != IGNORE_INDEX                                            # [B, N]
    if not chosen.any():
        raise ValueError(f"{where}: no position is chosen (every label is {IGNORE_INDEX})")
    targets = labels[chosen]                                                   # [M]
    if targets.min() < 0 or targets.max() >= logits.shape[-1]:
        raise ValueError(f"{where}: labels must lie in 0..{logits.shape[-1] - 1} or be {IGNORE_INDEX}")
    return F.cross_entropy(logits[chosen], targets)                            # only the chosen positions


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


def pad_batch(sequences: list[torch.Tensor], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D id tensors of different lengths into ``([B, N] ids, [B, N] mask)``, padded at the end.

    Args:
        sequences: ``B`` integer tensors ``[N_b]``, each with at least one id.
        pad_id: the id put after the shorter ones.

    Returns:
        ``(input_ids, attention_mask)``: ``[B, max N_b]`` ``torch.long``, and 1 for a real token, 0 for padding.

    Raises:
        TypeError: not a list of integer tensors. ValueError: an empty list, or a tensor that is not 1-D or empty.

    Example:
        >>> ids, mask = pad_batch([torch.tensor([2, 7, 3]), torch.tensor([2, 3])])
        >>> ids.tolist(), mask.tolist()
        ([[2, 7, 3], [2, 3, 0]], [[1, 1, 1], [1, 1, 0]])
    """
    where = "pad_batch"
    sequences = _validate.sequence(where, "sequences", sequences, of="tensors")
    if not sequences:
        raise ValueError(f"{where}: sequences must hold at least one tensor")
    sequences = [_validate.integer_tensor(where, "sequences", s) for s in sequences]
    if any(s.dim() != 1 or s.numel() == 0 for s in sequences):
        raise ValueError(f"{where}: every sequence must be a non-empty 1-D tensor")
    pad_id = _validate.integer(where, "pad_id", pad_id, minimum=0)
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)        # [B, N]
    mask = torch.zeros(len(sequences), length, dtype=torch.long)                # [B, N]
    for row, s in enumerate(sequences):
        ids[row, :len(s)], mask[row, :len(s)] = s, 1
    return ids, mask


def _pieces(vocab: WordVocabulary, rhymes: list[str], max_length: int) -> list[torch.Tensor]:
    """Each rhyme as ``[CLS] words [SEP]``, cut into pieces of at most ``max_length`` tokens."""
    pieces = []
    for rhyme in rhymes:
        ids = vocab.encode(rhyme)
        for start in range(0, len(ids), max_length - 2):
            chunk = ids[start:start + max_length - 2]
            pieces.append(torch.cat([torch.tensor([vocab.cls_id]), chunk, torch.tensor([vocab.sep_id])]))
    return pieces


def _unigram_log_probs(vocab: WordVocabulary) -> torch.Tensor:
    """``[V]`` log-frequencies of the training words; special tokens get probability 0."""
    counts = torch.tensor([0] * len(SPECIAL_TOKENS) + vocab.counts, dtype=torch.float64)
    return (counts / counts.sum()).log().float()


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
    train_pieces = _pieces(vocab, train_rhymes, config.max_length)
    held_ids, held_mask = pad_batch(_pieces(vocab, held_out_rhymes, config.max_length), vocab.pad_id)   # [R, N]
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

    def held_out_loss(model: MaskedLanguageModel) -> float:
        model.eval()
        with torch.no_grad():
            losses = [masked_lm_loss(model(m.input_ids, held_mask), m.labels) * m.chosen.sum() for m in held_out]
        model.train()
        return float(sum(losses) / sum(m.chosen.sum() for m in held_out))

    start = time.perf_counter()
    train_losses, eval_steps, held_out_losses = [], [], []
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
        best_state, best_step = None, None

        def score(step: int) -> None:
            nonlocal best_state, best_step
            eval_steps.append(step)
            held_out_losses.append(held_out_loss(model))
            if held_out_losses[-1] < min(held_out_losses[:-1], default=math.inf):
                best_state, best_step = copy.deepcopy(model.state_dict()), step

        if held_out:
            score(0)
        model.train()
        for step in range(1, config.steps + 1):
            rows = torch.randint(len(train_pieces), (config.batch_size,), generator=batch_generator)
            ids, mask = pad_batch([train_pieces[r] for r in rows.tolist()], vocab.pad_id)  # [B, N]
            masked = corrupt(ids, batch_generator)
            if not masked.chosen.any():
                continue
            loss = masked_lm_loss(model(masked.input_ids, mask), masked.labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            train_losses.append(loss.item())
            if held_out and (step % config.eval_every == 0 or step == config.steps):
                score(step)
        if best_state is not None:
            model.load_state_dict(best_state)
    model.eval()
    history = PretrainingHistory(train_losses, eval_steps, held_out_losses, unigram_loss, best_step,
                                 seconds=time.perf_counter() - start)
    return model, vocab, history


class MaskedWordAccuracy(NamedTuple):
    """What :func:`masked_word_accuracy` measured; every share is over the same blanks.

    Attributes:
        model: the share of blanks where the model's top word is the hidden word.
        model_top5: the share where the hidden word is among the model's 5 likeliest.
        unigram: the share for always guessing the most frequent training word.
        unigram_top5: the share where the hidden word is one of the 5 most frequent training words.
        unigram_word: the most frequent training word.
        blanks: how many blanks were scored (every known word of the rhymes, once).
    """

    model: float
    model_top5: float
    unigram: float
    unigram_top5: float
    unigram_word: str
    blanks: int


def _check_model_and_vocab(where: str, model: object, vocab: object) -> None:
    if not isinstance(model, MaskedLanguageModel):
        raise TypeError(f"{where}: model must be a MaskedLanguageModel, got {type(model).__name__}")
    if not isinstance(vocab, WordVocabulary):
        raise TypeError(f"{where}: vocab must be a WordVocabulary, got {type(vocab).__name__}")
    if len(vocab) != model.config.vocab_size:
        raise ValueError(f"{where}: vocab has {len(vocab)} tokens but the model {model.config.vocab_size}")


def masked_word_accuracy(model: MaskedLanguageModel, vocab: WordVocabulary, rhymes: list[str]) -> MaskedWordAccuracy:
    """How often the model fills a blank with the right word, against always guessing the commonest words.

    Every known word of every rhyme is hidden once, alone, by ``[MASK]`` (the rest of the rhyme
    intact), and the model's likeliest ordinary words are compared with it. ``[UNK]`` words are
    not asked for. Needs a vocabulary of at least 5 words.

    Args:
        model: a :class:`MaskedLanguageModel`.
        vocab: its :class:`WordVocabulary`.
        rhymes: the texts (held-out rhymes, to measure what was learned rather than remembered).

    Returns:
        :class:`MaskedWordAccuracy` ``(model, model_top5, unigram, unigram_top5, unigram_word, blanks)``.

    Raises:
        TypeError: arguments of the wrong kind. ValueError: a vocabulary that does not fit the model
            or has fewer than 5 words, or rhymes without a known word.

    Example:
        >>> rhymes = ["the cat sat on the mat in the hat"] * 8
        >>> config = PretrainingConfig(hidden_size=16, num_attention_heads=2, intermediate_size=32,
        ...                            steps=5, batch_size=4, eval_every=5)
        >>> model, vocab, _ = pretrain_mlm(rhymes, rhymes[:2], config)
        >>> masked_word_accuracy(model, vocab, rhymes[:1]).blanks
        9
    """
    where = "masked_word_accuracy"
    _check_model_and_vocab(where, model, vocab)
    if not isinstance(rhymes, list) or not all(isinstance(r, str) for r in rhymes):
        raise TypeError(f"{where}: rhymes must be a list of str, got {type(rhymes).__name__}")
    if len(vocab.words) < 5:
        raise ValueError(f"{where}: the vocabulary has {len(vocab.words)} words; at least 5 are needed")
    first = len(SPECIAL_TOKENS)                                   # id of the most frequent training word
    right = right5 = blanks = unigram_right = unigram_right5 = 0
    with torch.no_grad():
        for piece in _pieces(vocab, rhymes, model.config.max_position_embeddings):
            known = (piece >= first).nonzero().flatten()                       # [K] positions asked about
            if not len(known):
                continue
            copies = piece.repeat(len(known), 1)                               # [K, N]: one blank per copy
            copies[torch.arange(len(known)), known] = vocab.mask_id
            logits = model(copies)[torch.arange(len(known)), known]            # [K, V]
            logits[:, :first] = -math.inf                                       # only ordinary words
            top5 = logits.topk(5, dim=-1).indices                               # [K, 5]
            hidden = piece[known]                                               # [K]
            right += int((top5[:, 0] == hidden).sum())
            right5 += int((top5 == hidden[:, None]).any(-1).sum())
            unigram_right += int((hidden == first).sum())
            unigram_right5 += int((hidden < first + 5).sum())
            blanks += len(known)
    if not blanks:
        raise ValueError(f"{where}: the rhymes hold no word of the vocabulary")
    return MaskedWordAccuracy(right / blanks, right5 / blanks, unigram_right / blanks, unigram_right5 / blanks,
                              vocab.tokens[first], blanks)


def top_predictions(model: MaskedLanguageModel, vocab: WordVocabulary, text: str, word_index: int,
                    k: int = 5) -> list[tuple[str, float]]:
    """The model's ``k`` likeliest words for the ``word_index``-th word of ``text``, hidden by ``[MASK]``.

    Args:
        model: a :class:`MaskedLanguageModel`.
        vocab: its :class:`WordVocabulary`.
        text: a sentence or rhyme (split into words as :meth:`WordVocabulary.split` does).
        word_index: which word to hide, counted from 0 among the words of ``text``.
        k: how many words to return.

    Returns:
        ``k`` pairs ``(word, probability)``, likeliest first (special tokens excluded).

    Raises:
        TypeError: arguments of the wrong kind. ValueError: ``word_index`` out of range, too long a
            text, or ``k`` larger than the vocabulary.

    Example:
        >>> rhymes = ["the cat sat on the mat"] * 8
        >>> config = PretrainingConfig(hidden_size=16, num_attention_heads=2, intermediate_size=32,
        ...                            steps=5, batch_size=4, eval_every=5)
        >>> model, vocab, _ = pretrain_mlm(rhymes, rhymes[:2], config)
        >>> len(top_predictions(model, vocab, "the cat sat on the mat", 1, k=3))
        3
    """
    where = "top_predictions"
    _check_model_and_vocab(where, model, vocab)
    ids = vocab.encode(_text(where, text), add_special=True)                  # [N]
    word_index = _validate.integer(where, "word_index", word_index, minimum=0)
    if word_index >= len(ids) - 2:
        raise ValueError(f"{where}: word_index={word_index} but the text has {len(ids) - 2} words")
    if len(ids) > model.config.max_position_embeddings:
        raise ValueError(f"{where}: the text has {len(ids)} tokens, more than the model's "
                         f"{model.config.max_position_embeddings}")
    k = _validate.integer(where, "k", k, minimum=1)
    if k > len(vocab.words):
        raise ValueError(f"{where}: k={k} is more than the {len(vocab.words)} words of the vocabulary")
    ids[word_index + 1] = vocab.mask_id
    with torch.no_grad():
        logits = model(ids[None])[0, word_index + 1]                           # [V]
    logits[:len(SPECIAL_TOKENS)] = -math.inf
    probabilities, best = logits.softmax(-1).topk(k)
    return [(vocab.tokens[i], float(p)) for i, p in zip(best.tolist(), probabilities.tolist())]
