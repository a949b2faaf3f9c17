"""BERT's masked-language-model head and loss: a score for every token at every position, scored where hidden.

    logits = MaskedLanguageModel(config)(ids, attention_mask)   # BertModel + MLM head (tied weights), [B, N, V]
    loss = masked_lm_loss(logits, labels)                       # only where labels != -100

:func:`~attn_course.models.bert.mask_tokens` chooses and corrupts the positions;
:func:`~attn_course.models.bert.pretrain_mlm` trains the two on the course's rhymes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attn_course import _validate
from attn_course.models.bert.config import BertConfig
from attn_course.models.bert.masking import IGNORE_INDEX
from attn_course.models.bert.model import BertModel

__all__ = ["MaskedLanguageModel", "masked_lm_loss"]


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
