"""Attention weight versus contribution: the norm-based attribution of Kobayashi et al. (2020).

What head ``h`` adds to token ``i`` is ``Σ_j α_ij f_h(x_j)`` with ``f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h``,
the value of token ``j`` projected back by the head's slice of the output matrix. A large weight
on a short vector adds little, so *Attention is Not Only a Weight* (Kobayashi et al., 2020)
measures ``||α_ij f_h(x_j)|| = α_ij ||f_h(x_j)||`` instead of ``α_ij``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from attn_course.core.multihead import MultiHeadAttention, check_model_input, split_heads
from attn_course.models.bert.model import BertModel

__all__ = ["value_norms", "NormAttribution", "norm_attribution"]


def value_norms(attention: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """The length of what each head would add from each token at full weight, ``||f_h(x_j)||``.

    ``f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h``: token ``j``'s value in head ``h`` (bias included),
    times the rows of the output projection that head ``h`` feeds. The output projection's
    bias is left out: it is added once per token, whatever the weights. With grouped-query
    attention, head ``h`` reads the values of its group's key/value head.

    Args:
        attention: the :class:`~attn_course.core.multihead.MultiHeadAttention` (``layer.self_attention``).
        x: ``[B, N, E]`` what the values are computed from: the attention's input.

    Returns:
        ``[B, H, N]``: ``||f_h(x_j)||`` for every head ``h`` and token ``j``.

    Raises:
        TypeError: ``attention`` not a ``MultiHeadAttention``, or ``x`` not a floating tensor
            of the module's dtype.
        ValueError: ``x`` not ``[B, N, E]`` with the module's ``E``.

    Example:
        >>> attention = MultiHeadAttention(embed_dim=8, num_heads=2)
        >>> value_norms(attention, torch.randn(3, 5, 8)).shape                # [B, H, N]
        torch.Size([3, 2, 5])
    """
    where = "value_norms"
    if not isinstance(attention, MultiHeadAttention):
        raise TypeError(f"{where}: attention must be a MultiHeadAttention, got {type(attention).__name__}")
    x = check_model_input(attention, x, caller=where)
    heads, width = attention.num_heads, attention.embed_dim
    v = split_heads(attention.v_proj(x), attention.num_kv_heads)                 # [B, H_kv, N, d]
    if attention.num_kv_heads != heads:
        v = v.repeat_interleave(heads // attention.num_kv_heads, dim=1)        # [B, H, N, d]
    w_o = attention.out_proj.weight.T.reshape(heads, -1, width)                  # [H, d, E]
    return torch.einsum("bhnd,hde->bhne", v, w_o).norm(dim=-1)                  # [B, H, N]


class NormAttribution(NamedTuple):
    """What :func:`norm_attribution` returns: one tensor per layer in each field, first layer first.

    Attributes:
        weights: ``[B, H, N, N]`` per layer, the attention weights ``α_ij`` (as ``BertModel``'s
            ``attentions``).
        value_norms: ``[B, H, N]`` per layer, ``||f_h(x_j)||`` (see :func:`value_norms`).
        contributions: ``[B, H, N, N]`` per layer, ``||α_ij f_h(x_j)|| = α_ij ||f_h(x_j)||``:
            how much key ``j`` adds to query ``i`` through head ``h``.
    """

    weights: tuple[torch.Tensor, ...]
    value_norms: tuple[torch.Tensor, ...]
    contributions: tuple[torch.Tensor, ...]


def norm_attribution(
    model: BertModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
) -> NormAttribution:
    """Run ``model`` and measure, in every layer and head, what each token contributes to each other.

    The model runs once, as ``model(input_ids, attention_mask, token_type_ids)``, without
    gradients; each layer's attention input is recorded on the way and turned into
    :func:`value_norms`. Call it on a model in eval mode (as :func:`~attn_course.models.bert.load_pretrained`
    returns it): in training mode the weights would be the ones after dropout.

    Args:
        model: a :class:`~attn_course.models.bert.BertModel`.
        input_ids, attention_mask, token_type_ids: ``[B, N]`` each, as in :meth:`BertModel.forward
            <attn_course.models.bert.BertModel.forward>`.

    Returns:
        :class:`NormAttribution` ``(weights, value_norms, contributions)``, each a tuple of ``L``
        tensors. Padded keys get weight and contribution 0.

    Raises:
        TypeError: ``model`` not a ``BertModel``; otherwise as :meth:`BertModel.forward
            <attn_course.models.bert.BertModel.forward>`, under that name.
        ValueError: as :meth:`BertModel.forward <attn_course.models.bert.BertModel.forward>`.

    Example:
        >>> from attn_course.models.bert import attention_share, load_pretrained
        >>> model, tokenizer = load_pretrained()
        >>> found = norm_attribution(model, tokenizer("The bank of the river was muddy.").input_ids)
        >>> len(found.contributions), found.contributions[0].shape, found.value_norms[0].shape
        (6, torch.Size([1, 12, 10, 10]), torch.Size([1, 12, 10]))
        >>> by_weight = attention_share(found.weights, keys=[0, -1]).mean()       # on [CLS] and [SEP]
        >>> by_contribution = attention_share(found.contributions, keys=[0, -1]).mean()
        >>> round(by_weight.item(), 2), round(by_contribution.item(), 2)
        (0.57, 0.2)
    """
    where = "norm_attribution"
    if not isinstance(model, BertModel):
        raise TypeError(f"{where}: model must be a BertModel, got {type(model).__name__}")
    inputs = []                                      # each layer's attention input, [B, N, E]

    def record(module, args, kwargs):
        inputs.append(args[0] if args else kwargs["query"])

    hooks = [layer.self_attention.register_forward_pre_hook(record, with_kwargs=True) for layer in model.layers]
    try:
        with torch.no_grad():
            weights = model(input_ids, attention_mask, token_type_ids, output_attentions=True).attentions
            norms = tuple(value_norms(layer.self_attention, x) for layer, x in zip(model.layers, inputs))
    finally:
        for hook in hooks:
            hook.remove()
    contributions = tuple(w * n[:, :, None, :] for w, n in zip(weights, norms))   # [B, H, N, N] each
    return NormAttribution(weights, norms, contributions)
