"""A tiny character-level causal language model, trained on CPU in under a minute.

Chapter 04 trains it on the nursery rhymes shipped in ``attn_course/data`` and lets it
write new ones, one character at a time, with and without a key/value cache.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources

import torch
import torch.nn.functional as F
from torch import nn

from attn_course import _validate
from attn_course.kv_cache import KVCache
from attn_course.transformer import DecoderBlock

__all__ = ["load_rhymes", "CharTokenizer", "LanguageModelConfig", "TinyLanguageModel", "train_language_model"]


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


@dataclass(frozen=True)
class LanguageModelConfig:
    """Sizes of a :class:`TinyLanguageModel`.

    Args:
        vocab_size: number of token ids ``V``.
        max_length: the longest sequence, prompt and generated tokens together (the number of
            learned position embeddings).
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
        ids = _validate.integer_tensor(where, "ids", ids)
        if ids.dim() != 2 or ids.shape[1] == 0:
            raise ValueError(f"{where}: ids must be [B, N] with N >= 1, got shape {_validate.shape_str(ids)}")
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.config.vocab_size):
            raise ValueError(f"{where}: ids must lie in 0..{self.config.vocab_size - 1}, "
                             f"got values from {int(ids.min())} to {int(ids.max())}")
        if kv_caches is not None:
            if isinstance(kv_caches, KVCache) or not all(isinstance(c, KVCache) for c in kv_caches):
                raise TypeError(f"{where}: kv_caches must be a list of KVCache, one per block")
            if len(kv_caches) != len(self.blocks):
                raise ValueError(f"{where}: need one KVCache per block ({len(self.blocks)}), got {len(kv_caches)}")
        start = 0 if kv_caches is None else len(kv_caches[0])
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

        Without a cache every step re-runs the whole sequence (cost grows as N² per step);
        with one, each step feeds only the newest token and attends to the cached keys and
        values. Both produce the same tokens for the same generator state.

        Args:
            prompt: ``[N]`` or ``[B, N]`` token ids, at least one.
            max_new_tokens: how many tokens to add.
            use_cache: decode with :class:`KVCache`.
            temperature: divides the logits (lower = more predictable).
            generator: random generator for reproducible samples.

        Returns:
            ``[B, N + max_new_tokens]`` (or ``[N + max_new_tokens]`` for a 1-D prompt).

        Raises:
            TypeError, ValueError: a prompt that is not a 1-D or 2-D integer tensor, a total
                length beyond ``max_length``, a bad ``temperature``, or a non-bool ``use_cache``.
        """
        where = "TinyLanguageModel.generate"
        prompt = _validate.integer_tensor(where, "prompt", prompt)
        if prompt.dim() not in (1, 2):
            raise ValueError(f"{where}: prompt must be [N] or [B, N], got shape {_validate.shape_str(prompt)}")
        use_cache = _validate.boolean(where, "use_cache", use_cache)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"{where}: generator must be a torch.Generator, got {type(generator).__name__}")
        single = prompt.dim() == 1
        ids = prompt[None] if single else prompt
        max_new_tokens = _validate.integer(where, "max_new_tokens", max_new_tokens, minimum=0)
        temperature = _validate.positive_finite(where, "temperature", temperature)
        if ids.shape[1] < 1 or ids.shape[1] + max_new_tokens > self.config.max_length:
            raise ValueError(
                f"{where}: prompt length {ids.shape[1]} + max_new_tokens {max_new_tokens} must be between 1 "
                f"and max_length={self.config.max_length}"
            )
        caches = [KVCache(max_length=self.config.max_length) for _ in self.blocks] if use_cache else None
        new_input = ids
        for _ in range(max_new_tokens):
            logits = self(new_input if use_cache else ids, kv_caches=caches)[:, -1]   # [B, V]
            probabilities = torch.softmax(logits / temperature, dim=-1)
            next_id = torch.multinomial(probabilities, 1, generator=generator)     # [B, 1]
            ids = torch.cat([ids, next_id], dim=1)
            new_input = next_id
        return ids[0] if single else ids


def train_language_model(
    text: str,
    config: LanguageModelConfig | None = None,
    *,
    steps: int = 600,
    batch_size: int = 32,
    sequence_length: int = 64,
    learning_rate: float = 3e-3,
    seed: int = 0,
    progress: bool = True,
) -> tuple[TinyLanguageModel, CharTokenizer, list[float]]:
    """Train a :class:`TinyLanguageModel` to predict the next character of ``text``.

    Args:
        text: the training text.
        config: model sizes; ``vocab_size`` is taken from the text when omitted.
        steps: optimisation steps (AdamW, cosine-decayed learning rate).
        batch_size: random windows per step.
        sequence_length: characters per window.
        learning_rate: peak learning rate.
        seed: seeds the initial weights, the batches and any dropout; the caller's global
            random state is left as it was.
        progress: show a progress bar (tqdm).

    Returns:
        ``(model, tokenizer, losses)``, with the model in eval mode and one loss per step.

    Raises:
        TypeError, ValueError: a text shorter than a window, or sizes that are not positive.
    """
    where = "train_language_model"
    if not isinstance(text, str):
        raise TypeError(f"{where}: text must be a str, got {type(text).__name__}")
    if config is not None and not isinstance(config, LanguageModelConfig):
        raise TypeError(f"{where}: config must be a LanguageModelConfig, got {type(config).__name__}")
    seed = _validate.integer(where, "seed", seed, minimum=0)
    steps = _validate.integer(where, "steps", steps, minimum=1)
    batch_size = _validate.integer(where, "batch_size", batch_size, minimum=1)
    sequence_length = _validate.integer(where, "sequence_length", sequence_length, minimum=1)
    learning_rate = _validate.positive_finite(where, "learning_rate", learning_rate)
    tokenizer = CharTokenizer(text)
    data = tokenizer.encode(text)
    if len(data) <= sequence_length + 1:
        raise ValueError(f"{where}: text must be longer than sequence_length + 1 = {sequence_length + 1} characters")
    config = config or LanguageModelConfig(vocab_size=tokenizer.vocab_size)
    if config.vocab_size != tokenizer.vocab_size or sequence_length > config.max_length:
        raise ValueError(
            f"{where}: config.vocab_size must be {tokenizer.vocab_size} and max_length >= sequence_length "
            f"{sequence_length}, got {config}"
        )
    generator = torch.Generator().manual_seed(seed)                    # the batches
    offsets = torch.arange(sequence_length + 1)
    losses = []
    iterator = range(steps)
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, desc="training", unit="step")
    with torch.random.fork_rng(devices=[]), one_thread():                 # keep the caller's RNG
        torch.manual_seed(seed)                                          # the weights, then any dropout
        model = TinyLanguageModel(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / steps))
        )
        model.train()
        for _ in iterator:
            starts = torch.randint(0, len(data) - sequence_length - 1, (batch_size, 1), generator=generator)
            windows = data[starts + offsets]                               # [B, N + 1]
            logits = model(windows[:, :-1])                                # [B, N, V]
            loss = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
            if progress:
                iterator.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    model.eval()
    return model, tokenizer, losses
