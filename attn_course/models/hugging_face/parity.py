"""Each attention layer of a Hugging Face model beside the course's, on the very input Hugging Face gave it.

:func:`small_random_model` builds a small random model of one of chapter 12's architectures with Hugging Face's
own classes (no download: a config and random weights); :func:`attention_layer_errors` runs it once, catches
every attention layer's input with a forward hook, converts the layer with
:func:`~attn_course.models.hugging_face.layers.convert_layer` and compares the two outputs.
"""

from __future__ import annotations

import torch

from attn_course import _validate
from attn_course.models.hugging_face.layers import convert_layer

__all__ = ["SMALL_MODELS", "small_random_model", "attention_layer_errors"]

_SMALL = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
              vocab_size=64, num_hidden_layers=4, max_position_embeddings=64, initializer_range=0.2)
#: model_type -> (the transformers config class, its fields): windows of 4 tokens, every kind of layer at least once.
SMALL_MODELS = {
    "qwen3": ("Qwen3Config", _SMALL),
    "gemma3_text": ("Gemma3TextConfig", dict(_SMALL, sliding_window=4, query_pre_attn_scalar=32, layer_types=[
        "sliding_attention", "sliding_attention", "sliding_attention", "full_attention"])),
    # gpt-oss's YaRN stretches 4,096 positions by 32: max_position_embeddings says so, as the published config does.
    "gpt_oss": ("GptOssConfig", dict(_SMALL, sliding_window=4, num_local_experts=4, num_experts_per_tok=2,
                                     max_position_embeddings=131072)),
    "qwen3_next": ("Qwen3NextConfig", dict(_SMALL, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                           shared_expert_intermediate_size=32, linear_num_key_heads=2,
                                           linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)),
    # DeepSeek-V3.2: latent attention whose indexer keeps 5 of the 12 tokens of chapter 13's check.
    "deepseek_v32": ("DeepseekV32Config", dict(
        _SMALL, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32, qk_nope_head_dim=8, qk_rope_head_dim=4,
        v_head_dim=8, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        n_group=1, topk_group=1, num_hidden_layers=2, first_k_dense_replace=1, index_n_heads=2, index_head_dim=16,
        index_topk=5)),
}


def small_random_model(model_type: str, *, seed: int = 0):
    """A small random Hugging Face causal LM of ``model_type`` (a key of :data:`SMALL_MODELS`), eager attention.

    Its norms' weights and biases (QK-norm, the indexer's key norm, the linear layers' output norm), sink
    logits and the linear layers' ``dt_bias`` are moved away from their initial values (ones, zeros), so
    that a converter that forgot one would show.

    Raises:
        ValueError: another ``model_type``.
    """
    import transformers

    transformers.utils.logging.disable_progress_bar()      # saving a model of kilobytes needs no progress bar
    if model_type not in SMALL_MODELS:
        raise ValueError(f"small_random_model: model_type must be one of {', '.join(map(repr, SMALL_MODELS))}, "
                         f"got {model_type!r}")
    class_name, fields = SMALL_MODELS[model_type]
    config = getattr(transformers, class_name)(**fields)
    config._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if ("self_attn" in name or "linear_attn" in name) and (
                        "norm" in name or name.endswith(("sinks", "dt_bias"))):
                    parameter.add_(0.5 * torch.randn_like(parameter))
    return model


@torch.no_grad()
def attention_layer_errors(model, input_ids: torch.Tensor) -> list[tuple[str, float]]:
    """``[(layer kind, max |ours − theirs| / max |theirs|)]`` for every attention layer of ``model``, softmax or linear.

    Args:
        model: a Hugging Face causal LM whose layers hold ``self_attn`` or (Qwen3-Next's linear layers)
            ``linear_attn``.
        input_ids: ``[B, N]`` token ids.

    Raises:
        TypeError: ``input_ids`` not an integer tensor.
    """
    import transformers

    input_ids = _validate.token_ids("attention_layer_errors", "input_ids", input_ids, model.config.vocab_size)
    seen = []

    def record(module, args, kwargs, output):
        output = output if isinstance(output, torch.Tensor) else output[0]         # a linear layer returns a tensor
        seen.append((module, kwargs["hidden_states"] if "hidden_states" in kwargs else args[0], output))

    modules = [getattr(layer, "self_attn", None) or layer.linear_attn for layer in model.model.layers]
    hooks = [module.register_forward_hook(record, with_kwargs=True) for module in modules]
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()          # Qwen3-Next says it runs its reference PyTorch kernels
    try:
        model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
    finally:
        transformers.logging.set_verbosity(verbosity)
        for hook in hooks:
            hook.remove()
    kinds = getattr(model.config, "layer_types", None) or ["full_attention"] * len(modules)
    errors = []
    for kind, (module, hidden, theirs) in zip(kinds, seen):
        ours, _ = convert_layer(module, model.config)(hidden)
        errors.append((kind, ((ours - theirs).abs().max() / theirs.abs().max()).item()))
    return errors
