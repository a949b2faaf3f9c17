"""A model on the paged cache computes what it computes on the whole sequence at once.

The course's Llama (float64, random weights) runs each prompt's prefill in chunks, then decodes a batch
of sequences of different lengths in one forward pass per step, its keys and values scattered over the
blocks a BlockManager hands out; the reference is the same model run on each whole sequence, no cache.
"""

from __future__ import annotations

import pytest
import torch

from attn_course.models.llama import LlamaConfig, LlamaForCausalLM
from attn_course.serving import BlockManager, KVPool, PagedKVCache

CONFIG = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2)


def caches(pool, write_slots, read_slots):
    return [PagedKVCache(pool, layer, write_slots, read_slots) for layer in range(len(pool.keys))]


def slots(manager, sequence, positions):
    return torch.tensor([manager.slot(sequence, p) for p in positions])


@pytest.mark.parametrize("block_size", [1, 3, 4])
def test_chunked_prefill_and_batched_decode_equal_the_whole_sequence(block_size):
    torch.manual_seed(0)
    model = LlamaForCausalLM(CONFIG).double().eval()
    manager = BlockManager(num_blocks=64 // block_size + 8, block_size=block_size, prefix_caching=False)
    pool = KVPool(CONFIG.num_hidden_layers, manager.num_blocks * block_size, CONFIG.num_key_value_heads,
                  CONFIG.head_dim, dtype=torch.float64)
    pool.keys.zero_(), pool.values.zero_()          # padded reads below read slot 0: finite, whatever it holds
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(50, (n,), generator=generator).tolist() for n in (7, 2, 11)]
    tokens = {}
    with torch.no_grad():
        for sequence, prompt in enumerate(prompts):
            manager.allocate(sequence, prompt)
            tokens[sequence] = list(prompt)
            for start in range(0, len(prompt), 5):                              # chunks of 5 tokens
                chunk = list(range(start, min(start + 5, len(prompt))))
                written = slots(manager, sequence, chunk)[None]                 # [1, n]
                read = slots(manager, sequence, range(chunk[-1] + 1))[None]     # [1, N_k]
                logits = model(torch.tensor([prompt[start:chunk[-1] + 1]]), positions=torch.tensor(chunk),
                               kv_caches=caches(pool, written, read)).logits[0, -1]
            whole = model(torch.tensor([prompt])).logits[0, -1]
            torch.testing.assert_close(logits, whole, rtol=0, atol=1e-12)
            tokens[sequence].append(int(logits.argmax()))
        for _ in range(4):                                                      # decode all three at once
            lengths = [len(tokens[s]) for s in range(3)]
            for sequence, length in enumerate(lengths):
                manager.grow(sequence, length)
            longest = max(lengths)
            read = torch.stack([torch.cat([slots(manager, s, range(n)), torch.zeros(longest - n, dtype=torch.long)])
                                for s, n in enumerate(lengths)])                # padded with slot 0
            written = torch.stack([slots(manager, s, [n - 1]) for s, n in enumerate(lengths)])
            real = torch.arange(longest)[None] < torch.tensor(lengths)[:, None]   # [B, N_k]
            logits = model(torch.tensor([[tokens[s][-1]] for s in range(3)]), real.long(),
                           positions=torch.tensor(lengths)[:, None] - 1,
                           kv_caches=caches(pool, written, read)).logits[:, -1]   # [B, V]
            for sequence in range(3):
                whole = model(torch.tensor([tokens[sequence]])).logits[0, -1]
                torch.testing.assert_close(logits[sequence], whole, rtol=0, atol=1e-12)
                tokens[sequence].append(int(logits[sequence].argmax()))


@pytest.mark.parametrize("call, error, message", [
    (lambda pool: PagedKVCache(pool, 2, torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long)),
     ValueError, "layer must be < the pool's 2 layers, got 2"),
    (lambda pool: PagedKVCache(pool, 0, torch.zeros(1, 1), torch.zeros(1, 1, dtype=torch.long)),
     TypeError, "write_slots must be an integer tensor"),
    (lambda pool: PagedKVCache(pool, 0, torch.tensor([[8]]), torch.tensor([[8]])),
     ValueError, r"write_slots must lie in 0..7, got values from 8 to 8"),
    (lambda pool: PagedKVCache(pool, 0, torch.tensor([[1, 2]]), torch.tensor([[1]])),
     ValueError, "need one B and N_k >= N_new"),
    (lambda pool: PagedKVCache(pool, 0, torch.tensor([[1]]), torch.tensor([[1]])).append(
        torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4)), ValueError, "H_kv"),
    (lambda pool: KVPool(1, 0, 1, 4), ValueError, "num_slots must be >= 1, got 0"),
])
def test_bad_input_is_named(call, error, message):
    with pytest.raises(error, match=message):
        call(KVPool(num_layers=2, num_slots=8, num_kv_heads=1, head_dim=4))
