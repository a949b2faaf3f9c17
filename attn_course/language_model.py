"""A tiny character-level causal language model, trained on CPU in under a minute.

Chapter 04 trains it on the nursery rhymes shipped in ``attn_course/data`` (holding the last
tenth out to measure what it learned) and lets it write new ones, one character at a time,
with and without a key/value cache.

The model has learned position embeddings, one per position of its context window
(``LanguageModelConfig.max_length``). Training uses windows of exactly that length, so every
position is trained; generation keeps the last ``max_length`` tokens as its context (as
nanoGPT does: ``idx[:, -block_size:]``), so no position beyond the trained ones is ever used.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources

import torch
import torch.nn.functional as F
from torch import nn

from attn_course import _validate
from attn_course.kv_cache import KVCache
from attn_course.transformer import DecoderBlock

__all__ = [
    "load_rhymes",
    "held_out_split",
    "CharTokenizer",
    "LanguageModelConfig",
    "TinyLanguageModel",
    "TrainingHistory",
    "check_ids_and_caches",
    "nonoverlapping_windows",
    "mean_window_loss",
    "train_language_model",
]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one CPU thread inside the block, then restore the previous setting.

    This model's matrices are tiny (64 wide), so splitting each operation across threads
    costs more in synchronisation than it gains; when other programs load the CPU, a
    second thread that must wait for a busy core made training about 10× slower
    (0.76 s against 0.06 s per step, measured on a 2-core machine).
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def load_rhymes() -> str:
    """The course's training text: traditional (public-domain) English nursery rhymes, ~6 KB."""
    return resources.files("attn_course").joinpath("data/nursery_rhymes.txt").read_text(encoding="utf-8")


def held_out_split(text: str, fraction: float = 0.1) -> tuple[str, str]:
    """Split ``text`` into a part to train on and the last ``fraction`` of it, held out.

    The cut moves back to the nearest blank line before it, so that no rhyme (or paragraph)
    is split between the two parts; without a blank line it falls exactly at the fraction.

    Args:
        text: the whole text.
        fraction: the share of characters to hold out, in ``[0, 1)``; 0 holds out nothing.

    Returns:
        ``(train_text, held_out_text)``, which concatenate to ``text``.

    Raises:
        TypeError: ``text`` not a str, or ``fraction`` not a number.
        ValueError: ``fraction`` outside ``[0, 1)``.

    Example:
        >>> held_out_split("one two\\n\\nthree four\\n\\nfive", fraction=0.1)
        ('one two\\n\\nthree four\\n\\n', 'five')
    """
    where = "held_out_split"
    if not isinstance(text, str):
        raise TypeError(f"{where}: text must be a str, got {type(text).__name__}")
    fraction = _validate.dropout(where, fraction, name="fraction")
    if fraction == 0:
        return text, ""
    cut = round(len(text) * (1 - fraction))
    blank_line = text.rfind("\n\n", 0, cut)
    if blank_line > 0:
        cut = blank_line + 2
    return text[:cut], text[cut:]


class CharTokenizer:
    """Maps each distinct character of a text to an integer id, and back.

    Example:
        >>> tokenizer = CharTokenizer("abca")
        >>> tokenizer.encode("cab").tolist(), tokenizer.decode(torch.tensor([2, 0]))
        ([2, 0, 1], 'ca')
    """

    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"CharTokenizer: text must be a str, got {type(text).__name__}")
        if not text:
            raise ValueError("CharTokenizer: text must not be empty")
        self.characters = sorted(set(text))
        self._ids = {character: index for index, character in enumerate(self.characters)}

    @property
    def vocab_size(self) -> int:
        return len(self.characters)

    def encode(self, text: str) -> torch.Tensor:
        """``str`` of length N to ``[N]`` int64 ids."""
        if not isinstance(text, str):
            raise TypeError(f"CharTokenizer.encode: text must be a str, got {type(text).__name__}")
        unknown = sorted(set(text) - set(self._ids))
        if unknown:
            raise ValueError(f"CharTokenizer.encode: characters not in the vocabulary: {unknown}")
        return torch.tensor([self._ids[c] for c in text], dtype=torch.long)

    def decode(self, ids: torch.Tensor) -> str:
        """``[N]`` ids to a ``str``."""
        ids = _validate.integer_tensor("CharTokenizer.decode", "ids", ids)
        if ids.dim() != 1:
            raise ValueError(f"CharTokenizer.decode: ids must be 1-D [N], got shape {_validate.shape_str(ids)}")
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"CharTokenizer.decode: ids must lie in 0..{self.vocab_size - 1}, "
                             f"got values from {int(ids.min())} to {int(ids.max())}")
        return "".join(self.characters[int(i)] for i in ids.tolist())


def check_ids_and_caches(where: str, ids: object, kv_caches: object, *, vocab_size: int,
                         num_blocks: int) -> tuple[torch.Tensor, int]:
    """Check a character model's input: ``ids [B, N]`` of ids below ``vocab_size``, and one cache per block.

    Shared by the course's small causal models (this module's and
    :mod:`attn_course.length_extrapolation`'s), so they reject bad input with the same words.

    Args:
        where: the caller's name, for the messages.
        ids: ``[B, N]`` integer token ids, ``N >= 1``.
        kv_caches: None, or a list of :class:`~attn_course.kv_cache.KVCache`, one per block.
        vocab_size, num_blocks: the model's.

    Returns:
        ``(ids, start)``: the ids, and the position of the first of them (``len`` of the caches, or 0).

    Raises:
        TypeError, ValueError: ids that are not a 2-D integer tensor of ids below ``vocab_size``,
            caches that are not a list of KVCache, one per block.
    """
    ids = _validate.integer_tensor(where, "ids", ids)
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError(f"{where}: ids must be [B, N] with N >= 1, got shape {_validate.shape_str(ids)}")
    if ids.numel() and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"{where}: ids must lie in 0..{vocab_size - 1}, "
                         f"got values from {int(ids.min())} to {int(ids.max())}")
    if kv_caches is None:
        return ids, 0
    if isinstance(kv_caches, KVCache) or not isinstance(kv_caches, (list, tuple)) \
            or not all(isinstance(c, KVCache) for c in kv_caches):
        raise TypeError(f"{where}: kv_caches must be a list of KVCache, one per block")
    if len(kv_caches) != num_blocks:
        raise ValueError(f"{where}: need one KVCache per block ({num_blocks}), got {len(kv_caches)}")
    return ids, len(kv_caches[0])


@dataclass(frozen=True)
class LanguageModelConfig:
    """Sizes of a :class:`TinyLanguageModel`.

    Args:
        vocab_size: number of token ids ``V``.
        max_length: the context window: the number of learned position embeddings, hence the
            longest input of one forward pass. :func:`train_language_model` trains on windows of
            exactly this length, and :meth:`TinyLanguageModel.generate` keeps the last
            ``max_length`` tokens as context.
        embed_dim: model width ``E``.
        num_heads: ``H``; must divide ``E``.
        num_layers: number of decoder blocks.
        dropout: dropout while training, in ``[0, 1)``.

    Raises:
        TypeError, ValueError: sizes that are not positive ints, ``E`` not divisible by ``H``,
            or a dropout outside ``[0, 1)``.
    """

    vocab_size: int
    max_length: int = 128
    embed_dim: int = 64
    num_heads: int = 4
    num_layers: int = 2
    dropout: float = 0.0

    def __post_init__(self) -> None:
        where = "LanguageModelConfig"
        for field in ("vocab_size", "max_length", "embed_dim", "num_heads", "num_layers"):
            _validate.integer(where, field, getattr(self, field), minimum=1)
        if self.embed_dim % self.num_heads:
            raise ValueError(f"{where}: embed_dim={self.embed_dim} must be divisible by num_heads={self.num_heads}")
        _validate.dropout(where, self.dropout)


class TinyLanguageModel(nn.Module):
    """Token and position embeddings, a stack of causal decoder blocks, and a linear head.

    Example:
        >>> model = TinyLanguageModel(LanguageModelConfig(vocab_size=10))
        >>> model(torch.zeros(2, 5, dtype=torch.long)).shape
        torch.Size([2, 5, 10])
    """

    def __init__(self, config: LanguageModelConfig) -> None:
        super().__init__()
        if not isinstance(config, LanguageModelConfig):
            raise TypeError(f"TinyLanguageModel: config must be a LanguageModelConfig, got {type(config).__name__}")
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.embed_dim)
        self.position_embedding = nn.Embedding(config.max_length, config.embed_dim)
        self.blocks = nn.ModuleList(
            DecoderBlock(config.embed_dim, config.num_heads, dropout=config.dropout) for _ in range(config.num_layers)
        )
        self.final_norm = nn.LayerNorm(config.embed_dim)
        self.head = nn.Linear(config.embed_dim, config.vocab_size)

    def forward(self, ids: torch.Tensor, *, kv_caches: list[KVCache] | None = None) -> torch.Tensor:
        """Next-token logits for every position.

        Args:
            ids: ``[B, N]`` token ids. With caches, only the new tokens.
            kv_caches: one :class:`KVCache` per block, or None to process ``ids`` alone.

        Returns:
            ``[B, N, vocab_size]`` logits; position ``i`` predicts token ``i + 1``.

        Raises:
            TypeError, ValueError: ids that are not a 2-D integer tensor, a sequence longer
                than ``max_length``, or the wrong number of caches.
        """
        where = "TinyLanguageModel.forward"
        ids, start = check_ids_and_caches(where, ids, kv_caches, vocab_size=self.config.vocab_size,
                                          num_blocks=len(self.blocks))
        end = start + ids.shape[1]
        if end > self.config.max_length:
            raise ValueError(f"{where}: positions up to {end} exceed max_length={self.config.max_length}")
        positions = torch.arange(start, end, device=ids.device)
        x = self.token_embedding(ids) + self.position_embedding(positions)      # [B, N, E]
        for index, block in enumerate(self.blocks):
            x, _ = block(x, kv_cache=None if kv_caches is None else kv_caches[index])
        return self.head(self.final_norm(x))                                     # [B, N, V]

    @torch.no_grad()
    @one_thread()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        *,
        use_cache: bool = True,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Sample ``max_new_tokens`` tokens after ``prompt``, one at a time.

        The model only knows ``max_length`` positions, so its context is the last ``max_length``
        tokens: once the text is longer, the window slides and the oldest token drops out (as
        in nanoGPT, ``idx[:, -block_size:]``). No position beyond the trained ones is used.

        Without a cache, every step re-runs the model over the whole context. With one, each
        step feeds only the newest token and attends to the cached keys and values, as long as
        the context starts at the text's first token. Once the window slides, every token moves
        to a new position, and with learned position embeddings that changes every key and
        value in every layer: the cache no longer holds the right ones, so each step recomputes
        the cropped context in full, exactly as without a cache. Both ways produce the same
        tokens for the same generator state.

        Args:
            prompt: ``[N]`` or ``[B, N]`` token ids, at least one; a prompt longer than
                ``max_length`` is cropped to its last ``max_length`` tokens as context.
            max_new_tokens: how many tokens to add.
            use_cache: decode with :class:`KVCache` while the context fits the window.
            temperature: divides the logits (lower = more predictable).
            generator: random generator for reproducible samples.

        Returns:
            ``[B, N + max_new_tokens]`` (or ``[N + max_new_tokens]`` for a 1-D prompt): the whole
            prompt followed by the new tokens.

        Raises:
            TypeError, ValueError: a prompt that is not a 1-D or 2-D integer tensor or is empty,
                a bad ``temperature``, or a non-bool ``use_cache``.

        Example:
            >>> model = TinyLanguageModel(LanguageModelConfig(vocab_size=5, max_length=4)).eval()
            >>> model.generate(torch.tensor([1, 2]), 6, generator=torch.Generator().manual_seed(0)).shape
            torch.Size([8])
        """
        where = "TinyLanguageModel.generate"
        prompt = _validate.integer_tensor(where, "prompt", prompt)
        if prompt.dim() not in (1, 2) or prompt.shape[-1] < 1:
            raise ValueError(f"{where}: prompt must be [N] or [B, N] with N >= 1, got shape "
                             f"{_validate.shape_str(prompt)}")
        use_cache = _validate.boolean(where, "use_cache", use_cache)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"{where}: generator must be a torch.Generator, got {type(generator).__name__}")
        single = prompt.dim() == 1
        ids = prompt[None] if single else prompt
        max_new_tokens = _validate.integer(where, "max_new_tokens", max_new_tokens, minimum=0)
        temperature = _validate.positive_finite(where, "temperature", temperature)
        window = self.config.max_length
        caches = None
        for _ in range(max_new_tokens):
            context = ids[:, -window:]                                          # [B, <= window]
            if not use_cache or ids.shape[1] > window:
                logits = self(context)[:, -1]                                   # the whole context
            elif caches is None:
                caches = [KVCache(max_length=window) for _ in self.blocks]
                logits = self(context, kv_caches=caches)[:, -1]                 # prefill the cache
            else:
                logits = self(ids[:, -1:], kv_caches=caches)[:, -1]             # only the newest token
            probabilities = torch.softmax(logits / temperature, dim=-1)          # [B, V]
            next_id = torch.multinomial(probabilities, 1, generator=generator)  # [B, 1]
            ids = torch.cat([ids, next_id], dim=1)
        return ids[0] if single else ids


@dataclass(frozen=True)
class TrainingHistory:
    """What :func:`train_language_model` measured while training.

    Attributes:
        train_losses: the cross-entropy of each step's batch, one per step taken.
        validation_steps: after how many steps each validation loss was measured (0: before
            the first step).
        validation_losses: the mean cross-entropy over the held-out windows, one per entry of
            ``validation_steps``.
        best_step: the step (one of ``validation_steps``) with the lowest validation loss, whose
            weights the returned model holds; None when nothing was held out (the model then
            holds the last step's weights).
    """

    train_losses: list[float]
    validation_steps: list[int]
    validation_losses: list[float]
    best_step: int | None

    @property
    def best_validation_loss(self) -> float | None:
        """The lowest validation loss, or None when nothing was held out."""
        return min(self.validation_losses) if self.validation_losses else None


def nonoverlapping_windows(data: torch.Tensor, length: int) -> torch.Tensor:
    """Cut ids into non-overlapping windows of ``length + 1``, so that each one after the first is a target once.

    Args:
        data: ``[T]`` token ids.
        length: ``N``, the inputs per window (each window has one more id, the last target).

    Returns:
        ``[W, N + 1]`` with ``W = (T - 1) // N``; a tail too short for a window is left out.

    Example:
        >>> nonoverlapping_windows(torch.arange(8), 3).tolist()
        [[0, 1, 2, 3], [3, 4, 5, 6]]
    """
    starts = torch.arange(0, len(data) - length, length)                  # [W]
    return data[starts[:, None] + torch.arange(length + 1)]                # [W, N + 1]


def mean_window_loss(model: nn.Module, windows: torch.Tensor) -> float:
    """The mean next-token cross-entropy (nats) of ``model`` over ``windows`` (eval mode, no gradients).

    Args:
        model: maps ids ``[W, N]`` to logits ``[W, N, V]``; its training mode is restored afterwards.
        windows: ``[W, N + 1]`` ids, e.g. from :func:`nonoverlapping_windows`.

    Returns:
        the loss as a float.
    """
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(windows[:, :-1])                                     # [W, N, V]
        loss = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()).item()
    model.train(was_training)
    return loss


def train_language_model(
    text: str,
    config: LanguageModelConfig | None = None,
    *,
    steps: int = 600,
    batch_size: int = 32,
    sequence_length: int = 64,
    learning_rate: float = 3e-3,
    validation_fraction: float = 0.1,
    eval_every: int = 25,
    patience: int | None = 4,
    seed: int = 0,
    progress: bool = True,
    make_model: Callable[[int], nn.Module] | None = None,
) -> tuple[nn.Module, CharTokenizer, TrainingHistory]:
    """Train a :class:`TinyLanguageModel` to predict the next character of ``text``.

    The last ``validation_fraction`` of the text (cut at a blank line, see
    :func:`held_out_split`) is held out: every ``eval_every`` steps the model is scored on it,
    and the model returned holds the weights with the lowest validation loss. Training stops
    early once ``patience`` scorings in a row have not improved on the best.

    Args:
        text: the training text; its characters make the vocabulary.
        config: model sizes; when omitted, ``vocab_size`` comes from the text and
            ``max_length`` is ``sequence_length``. A given config must have
            ``max_length == sequence_length``, so that every position embedding is trained.
        steps: the most optimisation steps (AdamW, learning rate cosine-decayed over ``steps``).
        batch_size: random windows per step.
        sequence_length: characters per window: the context window ``N`` of the model.
        learning_rate: peak learning rate.
        validation_fraction: share of the text held out, in ``[0, 1)``; 0 trains on all of it
            and keeps the last weights.
        eval_every: steps between two validation scorings.
        patience: stop after this many scorings without a new best; None never stops early.
        seed: seeds the initial weights, the batches and any dropout; the caller's global
            random state is left as it was.
        progress: show a progress bar (tqdm).
        make_model: build another model instead of a :class:`TinyLanguageModel`: called with
            the vocabulary size ``V`` once the seed is set (so its initial weights are seeded
            too), it must return a module mapping ``[B, N]`` ids to ``[B, N, V]`` logits;
            ``config`` must then be None. Chapter 08 trains its position schemes this way.

    Returns:
        ``(model, tokenizer, history)``: the model in eval mode, and a :class:`TrainingHistory`.

    Raises:
        TypeError, ValueError: a training or held-out part shorter than a window, a config
            whose ``max_length`` differs from ``sequence_length``, both ``config`` and
            ``make_model``, or sizes that are not positive.
    """
    where = "train_language_model"
    if not isinstance(text, str):
        raise TypeError(f"{where}: text must be a str, got {type(text).__name__}")
    if config is not None and not isinstance(config, LanguageModelConfig):
        raise TypeError(f"{where}: config must be a LanguageModelConfig, got {type(config).__name__}")
    if make_model is not None and not callable(make_model):
        raise TypeError(f"{where}: make_model must be callable (vocab_size -> model), got {type(make_model).__name__}")
    if make_model is not None and config is not None:
        raise ValueError(f"{where}: give config or make_model, not both (make_model builds its own model)")
    seed = _validate.integer(where, "seed", seed, minimum=0)
    steps = _validate.integer(where, "steps", steps, minimum=1)
    batch_size = _validate.integer(where, "batch_size", batch_size, minimum=1)
    sequence_length = _validate.integer(where, "sequence_length", sequence_length, minimum=1)
    learning_rate = _validate.positive_finite(where, "learning_rate", learning_rate)
    validation_fraction = _validate.dropout(where, validation_fraction, name="validation_fraction")
    eval_every = _validate.integer(where, "eval_every", eval_every, minimum=1)
    if patience is not None:
        patience = _validate.integer(where, "patience", patience, minimum=1)
    tokenizer = CharTokenizer(text)
    train_text, held_out = held_out_split(text, validation_fraction)
    data, validation_data = tokenizer.encode(train_text), tokenizer.encode(held_out)
    if len(data) <= sequence_length + 1:
        raise ValueError(f"{where}: the training part of the text ({len(data)} characters) must be longer "
                         f"than sequence_length + 1 = {sequence_length + 1}")
    if validation_fraction and len(validation_data) <= sequence_length:
        raise ValueError(f"{where}: the held-out part ({len(validation_data)} characters) must be longer than "
                         f"sequence_length = {sequence_length}; hold out more or use shorter windows")
    config = config or LanguageModelConfig(vocab_size=tokenizer.vocab_size, max_length=sequence_length)
    if make_model is None and (config.vocab_size != tokenizer.vocab_size or config.max_length != sequence_length):
        raise ValueError(
            f"{where}: config.vocab_size must be {tokenizer.vocab_size} and config.max_length must equal "
            f"sequence_length={sequence_length} (a longer context would have position embeddings that "
            f"training never reaches), got {config}"
        )
    validation_windows = nonoverlapping_windows(validation_data, sequence_length) if validation_fraction else None
    generator = torch.Generator().manual_seed(seed)                    # the batches
    offsets = torch.arange(sequence_length + 1)
    train_losses, validation_steps, validation_losses = [], [], []
    best_state, best_step = None, None
    iterator = range(1, steps + 1)
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, desc="training", unit="step")
    with torch.random.fork_rng(devices=[]), one_thread():                 # keep the caller's RNG
        torch.manual_seed(seed)                                          # the weights, then any dropout
        model = TinyLanguageModel(config) if make_model is None else make_model(tokenizer.vocab_size)
        if not isinstance(model, nn.Module):
            raise TypeError(f"{where}: make_model must return a torch.nn.Module, got {type(model).__name__}")
        optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / steps))
        )

        def score(step: int) -> bool:
            """Measure the validation loss after ``step`` steps; True when training should stop."""
            nonlocal best_state, best_step
            validation_steps.append(step)
            validation_losses.append(mean_window_loss(model, validation_windows))
            if validation_losses[-1] < min(validation_losses[:-1], default=math.inf):
                best_state, best_step = copy.deepcopy(model.state_dict()), step
            return patience is not None and len(validation_steps) - 1 - validation_steps.index(best_step) >= patience

        if validation_windows is not None:
            score(0)
        model.train()
        for step in iterator:
            starts = torch.randint(0, len(data) - sequence_length - 1, (batch_size, 1), generator=generator)
            windows = data[starts + offsets]                               # [B, N + 1]
            logits = model(windows[:, :-1])                                # [B, N, V]
            loss = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            train_losses.append(loss.item())
            stop = validation_windows is not None and (step % eval_every == 0 or step == steps) and score(step)
            if progress:
                postfix = {"loss": f"{loss.item():.3f}"}
                if validation_losses:
                    postfix["validation"] = f"{validation_losses[-1]:.3f}"
                iterator.set_postfix(postfix, refresh=False)
            if stop:
                break
        if best_state is not None:
            model.load_state_dict(best_state)
    if progress:
        iterator.close()
    model.eval()
    history = TrainingHistory(train_losses, validation_steps, validation_losses, best_step)
    return model, tokenizer, history
