"""The engine's greedy tokens are Hugging Face's, request by request.

The reference is ``transformers``' ``LlamaForCausalLM.generate`` run on one request at a time (greedy, its
own KV cache, an explicit attention mask), from a small random model saved to a folder; the engine runs
the course's model loaded from that folder, every request at once, through continuous batching, chunked
prefill, prefix caching and preemption.
"""

from __future__ import annotations

import contextlib
import io
import random

import pytest
import torch

from attn_course.models.llama import LlamaConfig, LlamaForCausalLM, load_pretrained
from attn_course.serving import Engine

transformers = pytest.importorskip("transformers")

VOCAB = 96


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """``(Hugging Face's model, the course's loaded from its folder)``; weights drawn larger than Hugging
    Face's initialisation, so that greedy decoding does not hinge on near-ties."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    reference = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in reference.named_parameters():
            parameter.copy_(1 + 0.2 * torch.randn_like(parameter)) if name.endswith("norm.weight") \
                else parameter.normal_(0.0, 0.15)
    folder = tmp_path_factory.mktemp("llama")
    with contextlib.redirect_stderr(io.StringIO()):
        reference.save_pretrained(folder)
    return reference, load_pretrained(folder)


def hugging_face_tokens(reference, prompt: list[int], count: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=count, do_sample=False,
                             min_new_tokens=count)
    return out[0, len(prompt):].tolist()


def requests(seed: int, count: int, *, shared: list[int] | None = None):
    rng = random.Random(seed)
    prompts = [(shared or []) + [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 24))] for _ in range(count)]
    return prompts, [rng.randrange(1, 20) for _ in range(count)]


@pytest.mark.parametrize("case", ["roomy", "shared prefix", "preempted", "small chunks"])
def test_greedy_tokens_equal_hugging_face_request_by_request(models, case):
    reference, ours = models
    shared = [random.Random(7).randrange(VOCAB) for _ in range(21)] if case == "shared prefix" else None
    prompts, counts = requests(len(case), 10, shared=shared)
    options = {"roomy": dict(num_blocks=64, max_batch_size=8),
               "shared prefix": dict(num_blocks=64, max_batch_size=8),
               "preempted": dict(num_blocks=12, max_batch_size=8),     # 48 tokens, one request needs up to 42
               "small chunks": dict(num_blocks=64, max_batch_size=4, max_tokens_per_step=7)}[case]
    engine = Engine(ours, block_size=4, **options)
    if case == "shared prefix":
        # The first request alone: the prefix's blocks are named once computed, so requests admitted in the same
        # step as the first cannot share them yet; all nine later ones can (the pool keeps them between calls).
        got = engine.generate(prompts[:1], counts[:1]) + engine.generate(prompts[1:], counts[1:])
    else:
        got = engine.generate(prompts, counts)
    for prompt, count, tokens in zip(prompts, counts, got):
        assert tokens == hugging_face_tokens(reference, prompt, count), (case, prompt)
    blocks, scheduler = engine.blocks, engine.scheduler
    assert blocks.num_free_blocks == blocks.num_blocks and not scheduler.running and not scheduler.waiting
    if case == "shared prefix":
        assert blocks.cached_tokens >= 9 * 20          # the prefix's 5 full blocks of 4, for each later request
    if case == "preempted":
        assert scheduler.preemptions > 0


def test_sampling_is_reproducible_with_a_generator(models):
    prompts, counts = requests(3, 4)
    draws = [Engine(models[1], block_size=4, num_blocks=32, max_batch_size=4).generate(
        prompts, counts, temperature=1.0, generator=torch.Generator().manual_seed(5)) for _ in range(2)]
    assert draws[0] == draws[1]


@pytest.mark.parametrize("arguments, error, message", [
    (([[]], 3), ValueError, r"prompts\[0\] must not be empty"),
    (([[1, VOCAB]], 3), ValueError, rf"prompts\[0\] holds token {VOCAB}, outside the vocabulary 0..{VOCAB - 1}"),
    (([[1]], 0), ValueError, "max_new_tokens must be >= 1, got 0"),
    (([[1], [2]], [3]), ValueError, r"one count per prompt \(2\), got 1"),
    (([[1] * 30], 3), ValueError, r"needs 9 blocks for 30 \+ 3 tokens, but the pool has only num_blocks=8"),
    (("abc", 3), TypeError, "prompts must be a sequence"),
])
def test_bad_requests_are_refused_by_name(models, arguments, error, message):
    engine = Engine(models[1], block_size=4, num_blocks=8, max_batch_size=2)
    with pytest.raises(error, match=message):
        engine.generate(*arguments)


def test_a_model_it_cannot_serve_is_refused():
    config = LlamaConfig(vocab_size=10, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, sliding_window=4)
    with pytest.raises(ValueError, match="sliding-window layers"):
        Engine(LlamaForCausalLM(config), num_blocks=4, max_batch_size=1)
    with pytest.raises(TypeError, match="model must be a LlamaForCausalLM"):
        Engine(torch.nn.Linear(2, 2), num_blocks=4, max_batch_size=1)


# --- speculative decoding: the draft changes the speed, never the tokens ----------------------------------


@pytest.fixture(scope="module")
def hugging_face_answers(models):
    prompts, counts = requests(11, 10)
    return prompts, counts, [hugging_face_tokens(models[0], prompt, count) for prompt, count in zip(prompts, counts)]


def small_draft(vocab: int, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    draft = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2))
    with torch.no_grad():
        for parameter in draft.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.3)
    return draft


@pytest.mark.parametrize("draft_kind, k, num_blocks", [("another model", 3, 64), ("another model", 2, 12),
                                                       ("the model itself", 4, 64), ("the model itself", 1, 12)])
def test_speculative_greedy_tokens_equal_hugging_face(models, hugging_face_answers, draft_kind, k, num_blocks):
    prompts, counts, expected = hugging_face_answers
    draft = models[1] if draft_kind == "the model itself" else small_draft(VOCAB, seed=1)
    engine = Engine(models[1], block_size=4, num_blocks=num_blocks, max_batch_size=8, draft=draft,
                    num_speculative_tokens=k)
    assert engine.generate(prompts, counts) == expected
    assert engine.proposed_tokens > 0 and engine.blocks.num_free_blocks == engine.blocks.num_blocks
    if draft_kind == "the model itself":
        assert engine.acceptance_rate == 1.0              # every guess is the model's own: each step keeps k + 1
    else:
        assert engine.acceptance_rate < 0.5               # a random draft: most guesses are rejected
    if num_blocks == 12:
        assert engine.scheduler.preemptions > 0


def test_speculative_sampling_keeps_the_models_distribution():
    """4,000 requests of one prompt, 3 tokens each, from a model over 4 tokens with a draft that disagrees:
    the 64 possible answers must come out as often as the model alone would give them (chi-square at 0.001),
    and the same counts must fail the test against the draft's own distribution (the test can fail)."""
    from test_speculative import chi_square_holds

    vocab, prompt, runs = 4, [1, 3, 0], 4000
    target, draft = small_draft(vocab, seed=2), small_draft(vocab, seed=3)
    engine = Engine(target, block_size=4, num_blocks=2 * 256, max_batch_size=256, draft=draft,
                    num_speculative_tokens=2)
    answers = engine.generate([prompt] * runs, 3, temperature=1.0, generator=torch.Generator().manual_seed(0))
    counts = torch.zeros(vocab ** 3, dtype=torch.float64)
    for first, second, third in answers:
        counts[(first * vocab + second) * vocab + third] += 1
    assert 0 < engine.acceptance_rate < 1

    def answer_probabilities(model):                      # [64]: p(first) p(second | first) p(third | first, second)
        pairs = torch.cartesian_prod(torch.arange(vocab), torch.arange(vocab))             # [16, 2]
        ids = torch.cat([torch.tensor(prompt).expand(len(pairs), -1), pairs], dim=1)          # [16, 5]
        with torch.no_grad():
            p = torch.softmax(model(ids).logits.double(), dim=-1)[:, len(prompt) - 1:]       # [16, 3, V]
        joint = p[:, 0].gather(1, pairs[:, :1]) * p[:, 1].gather(1, pairs[:, 1:]) * p[:, 2]  # [16, V]
        return joint.reshape(-1)

    assert chi_square_holds(counts, answer_probabilities(target)), counts
    assert not chi_square_holds(counts, answer_probabilities(draft))


@pytest.mark.parametrize("options, error, message", [
    (dict(num_speculative_tokens=2), ValueError, "needs both a draft and num_speculative_tokens >= 1"),
    (dict(draft="self"), ValueError, "needs both a draft and num_speculative_tokens >= 1"),
    (dict(draft="small vocabulary", num_speculative_tokens=2), ValueError,
     f"draft has a vocabulary of 10 tokens, the model {VOCAB}"),
    (dict(draft=torch.nn.Linear(2, 2), num_speculative_tokens=2), TypeError, "draft must be a LlamaForCausalLM"),
    (dict(draft="self", num_speculative_tokens=-1), ValueError, "num_speculative_tokens must be >= 0, got -1"),
])
def test_a_bad_draft_is_refused_by_name(models, options, error, message):
    options = dict(options)
    if options.get("draft") == "self":
        options["draft"] = models[1]
    elif options.get("draft") == "small vocabulary":
        options["draft"] = small_draft(10, seed=0)
    with pytest.raises(error, match=message):
        Engine(models[1], block_size=4, num_blocks=8, max_batch_size=2, **options)


def test_step_records_follow_the_pool_and_the_queue(models):
    """Each record is the step as it ran: its prompt chunks and decodes add up to every token computed, its block
    tables hold distinct blocks of the pool, and a preempted request is back in the queue."""
    prompts, counts = requests(5, 6)
    engine = Engine(models[1], block_size=4, num_blocks=12, max_batch_size=4, max_tokens_per_step=9,
                    prefix_caching=False, record_steps=True)
    engine.generate(prompts, counts)
    records = engine.step_records
    assert [record.step for record in records] == list(range(1, engine.steps + 1))
    for record, before in zip(records, [None, *records]):
        held = [block for table in record.block_tables.values() for block in table]
        assert len(held) == len(set(held)) and all(0 <= block < 12 for block in held)
        assert set(record.prefills) | set(record.decodes) <= set(record.block_tables)
        assert sum(record.prefills.values()) + len(record.decodes) <= 9
        if before is not None and record.preemptions > before.preemptions:
            assert set(before.block_tables) - set(record.block_tables) & set(record.waiting)
    computed = sum(sum(record.prefills.values()) + len(record.decodes) for record in records)
    recomputed = computed - sum(len(prompt) + count - 1 for prompt, count in zip(prompts, counts))
    assert (recomputed > 0) == (records[-1].preemptions > 0)        # tokens computed again only after a preemption
    assert Engine(models[1], num_blocks=4, max_batch_size=1).step_records == []      # off unless asked
