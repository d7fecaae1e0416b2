"""Continuous batching: which tokens of which sequences run in the next step.

Every step packs a token budget. Running sequences come first, one token for
each that is decoding, then the rest of any chunked prefill; waiting
sequences are admitted after that, each starting from its longest cached
prefix. Any sequence that needs exactly one more token is a decode; the
attention code batches those together.

Shared prefill. Requests sent to several panes at once share their whole
history, and on a cold cache none of it is cached yet. A waiting sequence
whose full pages include one that a running sequence has yet to compute (the
same chained content hash) is not admitted: it waits, skipped by admission,
until that sequence has computed and registered the shared pages, and is then
admitted from the prefix cache like any hit. So the shared full pages are
computed once and the followers compute only what is theirs (at least the
last token, whose logits they sample from). The wait ends whenever the
leader stops computing the pages, however: finished, aborted or preempted,
it leaves the running list and the follower is admitted with whatever the
leader registered, computing the rest itself. A leader whose twin (the same
ids) waits stops its chunk at its last full page and computes its last
tokens in the step its twins compute theirs, in chunks of one shape, so
panes sent one message with the same settings get one reply.

When pages run out, the most recently admitted running sequence is preempted:
its pages go back to the pool (the full ones stay in the prefix cache) and it
waits at the head of the queue, so its recompute later is mostly cache hits.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.core.page_pool import PageHash, PagePool
from engine.errors import KVCacheTooSmallError, RequestTooLargeError
from engine.core.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class ScheduledChunk:
    seq: Sequence
    start: int  # first position computed in this step (== seq.num_computed)
    num_tokens: int

    @property
    def samples(self) -> bool:
        """True when the chunk reaches the end of the sequence: a token is sampled."""
        return self.start + self.num_tokens == len(self.seq.token_ids)


@dataclass(slots=True)
class ScheduleResult:
    decodes: list[ScheduledChunk] = field(default_factory=list)
    prefills: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def chunks(self) -> list[ScheduledChunk]:
        return self.decodes + self.prefills

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(c.num_tokens for c in self.prefills)


class Scheduler:
    def __init__(
        self, pool: PagePool, max_batch_tokens: int, max_running: int, max_context: int
    ) -> None:
        if max_batch_tokens < 1 or max_running < 1:
            raise ValueError("max_batch_tokens and max_running must be positive")
        self.pool = pool
        self.page_size = pool.page_size
        self.max_batch_tokens = max_batch_tokens
        self.max_running = max_running
        self.max_context = max_context
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order, oldest first
        self.total_preemptions = 0

    # -- admission -------------------------------------------------------

    def check_fits(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """Raise RequestTooLargeError for a request that could never run."""
        total = num_prompt_tokens + max_tokens
        if total > self.max_context:
            raise RequestTooLargeError(
                f"The prompt has {num_prompt_tokens} tokens and up to {max_tokens} may be "
                f"generated, but the model's context holds {self.max_context} tokens. "
                "Shorten the conversation or lower the maximum reply length."
            )
        # The last generated token is never fed back, so it needs no KV slot.
        pages = self._pages_for(total - 1)
        if pages > self.pool.num_pages:
            raise KVCacheTooSmallError(
                f"The request needs {pages} KV-cache pages ({total} tokens) but the "
                f"cache has only {self.pool.num_pages}; give the engine more KV-cache "
                "memory or shorten the request."
            )

    def add(self, seq: Sequence) -> None:
        self.check_fits(len(seq.token_ids), seq.params.max_tokens)
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- the step ----------------------------------------------------------

    def schedule(self) -> ScheduleResult:
        result = ScheduleResult()
        scheduled: dict[Sequence, ScheduledChunk] = {}
        budget = self.max_batch_tokens

        # Decodes before prefill continuations, so a long prompt being chunked
        # in never delays the sequences that are already streaming.
        ordered = [s for s in self.running if s.num_uncomputed == 1]
        ordered += [s for s in self.running if s.num_uncomputed > 1]
        for seq in ordered:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            num = self._chunk_tokens(seq, budget)
            needed = self._pages_for(seq.num_computed + num) - len(seq.pages)
            while not self.pool.can_allocate(needed):
                victim = self.running[-1]
                chunk = scheduled.pop(victim, None)
                if chunk is not None:
                    budget += chunk.num_tokens
                self._preempt(victim)
                result.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            seq.pages.extend(self.pool.allocate(needed))
            scheduled[seq] = ScheduledChunk(seq, seq.num_computed, num)
            budget -= num

        # New work only when nothing had to give way this step: admitting
        # while preempting would just thrash.
        if not result.preempted and self.waiting:
            in_flight = self._pages_in_flight()
            index = 0
            while index < len(self.waiting) and budget > 0 and len(self.running) < self.max_running:
                seq = self.waiting[index]
                if self._shares_pages_in_flight(seq, in_flight):
                    index += 1  # a follower: admitted once the pages are cached
                    continue
                chunk = self._admit(seq, budget)
                if chunk is None:
                    break  # first come, first served: nobody overtakes for pages
                del self.waiting[index]
                self.running.append(seq)
                self._add_in_flight(seq, in_flight)
                scheduled[seq] = chunk
                budget -= chunk.num_tokens

        for chunk in scheduled.values():
            (result.decodes if chunk.num_tokens == 1 else result.prefills).append(chunk)
        return result

    def _admit(self, seq: Sequence, budget: int) -> ScheduledChunk | None:
        ps = self.page_size
        # The last token is always computed, even on a full hit: its logits
        # are what the next token is sampled from.
        pages, hashes = self.pool.match_prefix(
            seq.token_ids, max_pages=(len(seq.token_ids) - 1) // ps
        )
        self.pool.acquire(pages)
        seq.pages = list(pages)
        seq.page_hashes = list(hashes)
        seq.num_computed = len(pages) * ps
        num = self._chunk_tokens(seq, budget)
        needed = self._pages_for(seq.num_computed + num) - len(seq.pages)
        if not self.pool.can_allocate(needed):
            self._release(seq)
            return None
        seq.pages.extend(self.pool.allocate(needed))
        seq.status = SequenceStatus.RUNNING
        if seq.metrics.preemptions == 0:
            seq.metrics.cached_prompt_tokens = seq.num_computed
        return ScheduledChunk(seq, seq.num_computed, num)

    # -- shared prefill ------------------------------------------------------

    def _pages_in_flight(self) -> set[PageHash]:
        """The content hashes of the full pages running sequences have yet to compute."""
        in_flight: set[PageHash] = set()
        if self.pool.enable_prefix_cache:
            for seq in self.running:
                self._add_in_flight(seq, in_flight)
        return in_flight

    def _add_in_flight(self, seq: Sequence, in_flight: set[PageHash]) -> None:
        if not self.pool.enable_prefix_cache:
            return  # nothing computed is registered, so a follower could never hit it
        ps = self.page_size
        first, end = seq.num_computed // ps, len(seq.token_ids) // ps
        if first < end:
            in_flight.update(self._content_hashes(seq, end)[first:end])

    def _shares_pages_in_flight(self, seq: Sequence, in_flight: set[PageHash]) -> bool:
        """Whether a full page that `seq` would compute is being computed by a
        running sequence. Its pages before that one are then cached already:
        the other sequence registered them, and holds them, as it went."""
        if not in_flight:
            return False
        # As in _admit: the last token is computed even on a full hit.
        shareable = (len(seq.token_ids) - 1) // self.page_size
        return not in_flight.isdisjoint(self._content_hashes(seq, shareable)[:shareable])

    def _chunk_tokens(self, seq: Sequence, budget: int) -> int:
        """How many of `seq`'s uncomputed tokens to compute in this step.

        A sequence whose twin (the same ids: a message broadcast to panes on
        one model) waits to follow it stops its chunk at its last full page,
        so that it computes the rest in the step its twins compute theirs,
        in a chunk of the same start and length: the twins then get its
        reply, bit for bit, where a prefill chunk's arithmetic depends on
        its length (outside deterministic mode).
        """
        num = min(seq.num_uncomputed, budget)
        tail_start = (len(seq.token_ids) - 1) // self.page_size * self.page_size
        if seq.num_computed < tail_start < seq.num_computed + num and self._has_waiting_twin(seq):
            num = tail_start - seq.num_computed
        return num

    def _has_waiting_twin(self, seq: Sequence) -> bool:
        if not self.pool.enable_prefix_cache:
            return False
        length = len(seq.token_ids)
        return any(
            other is not seq and len(other.token_ids) == length and other.token_ids == seq.token_ids
            for other in self.waiting
        )

    def _content_hashes(self, seq: Sequence, num_pages: int) -> list[PageHash]:
        """The chained content hashes of `seq`'s first `num_pages` full pages."""
        hashes = seq.content_hashes
        ps = self.page_size
        while len(hashes) < num_pages:
            index = len(hashes)
            parent = hashes[-1] if index else None
            hashes.append(self.pool.hash_page(parent, seq.token_ids[index * ps : (index + 1) * ps]))
        return hashes

    def commit(self, result: ScheduleResult) -> None:
        """Record that the step's chunks were computed; cache newly full pages."""
        ps = self.page_size
        for chunk in result.chunks:
            seq = chunk.seq
            seq.num_computed = chunk.start + chunk.num_tokens
            full = seq.num_computed // ps
            while len(seq.page_hashes) < full:
                index = len(seq.page_hashes)
                parent = seq.page_hashes[-1] if index else None
                tokens = seq.token_ids[index * ps : (index + 1) * ps]
                seq.page_hashes.append(self.pool.register(seq.pages[index], parent, tokens))

    # -- leaving -----------------------------------------------------------

    def finish(self, seq: Sequence) -> None:
        """Take a sequence out of the scheduler (finished or aborted) and free its pages."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        self._release(seq)
        seq.status = SequenceStatus.FINISHED

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.status = SequenceStatus.WAITING
        seq.metrics.preemptions += 1
        self.total_preemptions += 1
        self.waiting.appendleft(seq)

    def _release(self, seq: Sequence) -> None:
        if seq.pages:
            self.pool.release(seq.pages)
        seq.pages = []
        seq.page_hashes = []
        seq.num_computed = 0

    def _pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)
