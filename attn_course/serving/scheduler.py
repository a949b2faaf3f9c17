"""Which requests run in the next forward pass: continuous batching with chunked prefill.

Orca (Yu et al., 2022) schedules each *iteration* rather than each batch: a request joins as soon as there
is room and leaves as soon as it is done, instead of waiting for the longest request of a fixed batch.
Each step here:

1. every running request past its prompt decodes one token (and checks a draft model's guesses at the
   next few, when the engine decodes speculatively); it first needs slots for them, and when the pool has
   none the most recently admitted request is *preempted*: its blocks are freed and it goes back
   to the front of the queue, to be computed again from its tokens when it returns (vLLM's recomputation);
2. the remaining token budget goes to prompts (Sarathi-Serve's chunked prefill): first those already
   running, then the queue's head, admitted if the pool can hold its tokens. The queue is first come,
   first served: a request that does not fit waits, and nobody behind it jumps it.

A request's life: waiting → running → finished, or running → waiting again when preempted.
"""

from __future__ import annotations

import collections
import dataclasses

from attn_course import _validate
from attn_course.serving.block_manager import BlockManager

__all__ = ["Request", "Scheduler", "Step"]


@dataclasses.dataclass(eq=False)
class Request:
    """One prompt and the tokens generated for it.

    ``computed`` counts the tokens whose keys and values are in the cache; the next forward pass runs on
    ``tokens[computed:]`` (one token when decoding: the one sampled last). ``draft_computed`` counts those
    in the draft model's cache, when the engine has one (it may lag ``computed`` by a token).
    """

    request_id: int
    prompt: list[int]
    max_new_tokens: int
    output: list[int] = dataclasses.field(default_factory=list)
    computed: int = 0
    draft_computed: int = 0
    preemptions: int = 0

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def finished(self) -> bool:
        return len(self.output) >= self.max_new_tokens

    @property
    def decoding(self) -> bool:
        """Past its prompt: the next pass runs on its last token alone."""
        return len(self.prompt) + len(self.output) - self.computed == 1 and bool(self.output)

    def speculative_tokens(self, most: int) -> int:
        """How many draft tokens its next decoding step checks: at most ``most``, and never so many that the
        step could produce more tokens than the request still wants (a step yields up to one more than that)."""
        return max(0, min(most, self.max_new_tokens - len(self.output) - 1))


@dataclasses.dataclass
class Step:
    """One step's work: ``(request, tokens to compute)`` for prompts, and the requests that decode."""

    prefills: list[tuple[Request, int]]
    decodes: list[Request]


class Scheduler:
    """Continuous batching over a :class:`~attn_course.serving.block_manager.BlockManager`.

    Args:
        blocks: the pool's bookkeeping.
        max_batch_size: requests running at once.
        max_tokens_per_step: tokens computed in one step, decodes and prompt chunks together.
        num_speculative_tokens: draft tokens a decoding request checks per step: it takes slots and budget
            for them too.

    Raises:
        TypeError, ValueError: ``blocks`` not a BlockManager, sizes that are not ints ``>= 1``.
    """

    def __init__(self, blocks: BlockManager, *, max_batch_size: int, max_tokens_per_step: int,
                 num_speculative_tokens: int = 0) -> None:
        where = "Scheduler"
        self.blocks = _validate.instance(where, "blocks", blocks, BlockManager)
        self.max_batch_size, self.max_tokens_per_step = _validate.integers(
            where, minimum=1, max_batch_size=max_batch_size, max_tokens_per_step=max_tokens_per_step)
        self.num_speculative_tokens = _validate.integer(where, "num_speculative_tokens", num_speculative_tokens,
                                                        minimum=0)
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []                # in order of admission
        self.preemptions = 0

    def add(self, request: Request) -> None:
        """Queue ``request`` (last)."""
        self.waiting.append(_validate.instance("Scheduler.add", "request", request, Request))

    def schedule(self) -> Step:
        """The next step's work (see the module's docstring); blocks for it are taken now."""
        decodes, budget = [], self.max_tokens_per_step
        for request in list(self.running):
            if request not in self.running or not request.decoding:
                continue
            # Slots for the token it decodes and for the draft's guesses after it, which the check writes.
            needed = len(request.tokens) + request.speculative_tokens(self.num_speculative_tokens)
            while request in self.running and not self.blocks.can_grow(request.request_id, needed):
                self._preempt(self.running[-1])                          # the newest gives way, possibly itself
            if request in self.running:
                self.blocks.grow(request.request_id, needed)
                decodes.append(request)
                budget -= needed - request.computed
        prefills = []
        for request in self.running:
            if not request.decoding and budget > 0:
                count = min(len(request.tokens) - request.computed, budget)
                prefills.append((request, count))
                budget -= count
        while self.waiting and budget > 0 and len(self.running) < self.max_batch_size:
            request = self.waiting[0]
            if not self.blocks.can_allocate(request.tokens):
                break                                                    # first come, first served
            self.waiting.popleft()
            request.computed = request.draft_computed = self.blocks.allocate(request.request_id, request.tokens)
            self.running.append(request)
            count = min(len(request.tokens) - request.computed, budget)
            prefills.append((request, count))
            budget -= count
        return Step(prefills, decodes)

    def finish(self, request: Request) -> None:
        """``request`` is done: its blocks go back to the pool."""
        self.blocks.free(request.request_id)
        self.running.remove(request)

    def _preempt(self, request: Request) -> None:
        self.blocks.free(request.request_id)
        self.running.remove(request)
        request.computed = request.draft_computed = 0
        request.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(request)
