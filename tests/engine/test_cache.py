"""The KV page pool and prefix cache: state-machine properties and scenarios."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from engine.core.page_pool import OutOfPagesError, PageHash, PagePool, PagePoolStats


class WeakHashPool(PagePool):
    """A pool whose hash has five values, so most pages collide."""

    def hash_page(self, parent: PageHash | None, token_ids: Sequence[int]) -> PageHash:
        return super().hash_page(parent, token_ids) % 5


class ParentBlindPool(PagePool):
    """Equal pages collide whatever precedes them: the chain is ignored."""

    def hash_page(self, parent: PageHash | None, token_ids: Sequence[int]) -> PageHash:
        return super().hash_page(None, token_ids)


class FirstTokenBlindPool(PagePool):
    """Pages that differ only in their first token collide."""

    def hash_page(self, parent: PageHash | None, token_ids: Sequence[int]) -> PageHash:
        return super().hash_page(parent, [0, *token_ids[1:]])


# A small alphabet, so that prompts often share prefixes.
TOKEN = st.integers(0, 1)
PROMPT = st.lists(TOKEN, min_size=1, max_size=8)


def pages_for(num_tokens: int, page_size: int) -> int:
    return -(-num_tokens // page_size)


# -- state machine ---------------------------------------------------------------


@dataclass(slots=True)
class ModelSeq:
    tokens: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    hashes: list[PageHash] = field(default_factory=list)  # one per full page


class PoolSafetyMachine(RuleBasedStateMachine):
    """Drives a pool like the scheduler does and checks what holds for any hash.

    `truth` records, for every full page a sequence computed, the whole token
    prefix its K/V stands for; a matched page must hold exactly the query's
    prefix. Subclasses add an exact reference model of the cache.
    """

    pool_class: type[PagePool] = WeakHashPool

    def __init__(self) -> None:
        super().__init__()
        self.seqs: dict[int, ModelSeq] = {}
        self.blobs: list[list[int]] = []  # pages held by allocation pressure
        self.next_seq_id = 0
        self.truth: dict[int, tuple[int, ...]] = {}
        self.queried_pages = 0
        self.hit_pages = 0

    @initialize(
        num_pages=st.integers(1, 16),
        page_size=st.integers(1, 3),
        enabled=st.sampled_from([True, True, True, False]),
    )
    def make_pool(self, num_pages: int, page_size: int, enabled: bool) -> None:
        self.pool = self.pool_class(num_pages, page_size, enable_prefix_cache=enabled)
        self.ps = page_size

    # -- hooks for the reference model ----------------------------------------

    def on_acquire(self, pages: list[int]) -> None:
        pass

    def on_allocate(self, new: list[int], from_free: int) -> None:
        pass

    def on_release(self, dropped: list[int], joined: list[int]) -> None:
        pass

    def on_register(self, seq: ModelSeq, index: int, returned: PageHash) -> None:
        pass

    def on_reset(self) -> None:
        pass

    def expected_match(self, tokens: list[int], max_pages: int | None) -> list[int] | None:
        return None  # unknown without a reference model

    # -- operations, each checked ---------------------------------------------

    def allocate(self, n: int) -> list[int]:
        free_before = self.pool.num_free
        lru_before = self.pool.evictable_in_lru_order()
        new = self.pool.allocate(n)
        assert len(new) == n == len(set(new))
        from_free = min(n, free_before)
        assert new[from_free:] == lru_before[: n - from_free], "eviction is not LRU order"
        assert not set(new[:from_free]) & set(lru_before), "evicted while free pages were left"
        assert self.pool.evictable_in_lru_order() == lru_before[n - from_free :]
        for page_id in new:
            assert self.pool.refcount(page_id) == 1
            self.truth.pop(page_id, None)
        self.on_allocate(new, from_free)
        return new

    def holders(self) -> Counter[int]:
        held: Counter[int] = Counter()
        for seq in self.seqs.values():
            held.update(seq.pages)
        for blob in self.blobs:
            held.update(blob)
        return held

    def release(self, pages: list[int]) -> None:
        lru_before = self.pool.evictable_in_lru_order()
        free_before = self.pool.num_free
        self.pool.release(pages)
        held = self.holders()
        dropped = [p for p in reversed(pages) if held[p] == 0]
        lru_after = self.pool.evictable_in_lru_order()
        assert lru_after[: len(lru_before)] == lru_before
        joined = lru_after[len(lru_before) :]
        assert joined == [p for p in dropped if p in joined], "release is not tail first"
        assert self.pool.num_free == free_before + len(dropped) - len(joined)
        if not self.pool.enable_prefix_cache:
            assert joined == []
        self.on_release(dropped, joined)

    def match(self, tokens: list[int], max_pages: int | None) -> tuple[list[int], list[PageHash]]:
        pages, hashes = self.pool.match_prefix(tokens, max_pages)
        assert len(pages) == len(hashes)
        for i, page_id in enumerate(pages):
            assert self.truth.get(page_id) == tuple(tokens[: (i + 1) * self.ps]), (
                f"page {page_id} returned for a prefix it does not hold"
            )
        limit = len(tokens) // self.ps
        if max_pages is not None:
            limit = max(0, min(limit, max_pages))
        assert len(pages) <= limit
        if self.pool.enable_prefix_cache:
            self.queried_pages += limit
            self.hit_pages += len(pages)
        else:
            assert pages == []
        expected = self.expected_match(tokens, max_pages)
        if expected is not None:
            assert pages == expected
        return pages, hashes

    def register_full_pages(self, seq: ModelSeq) -> None:
        for index in range(len(seq.hashes), len(seq.tokens) // self.ps):
            parent = seq.hashes[-1] if seq.hashes else None
            page_tokens = seq.tokens[index * self.ps : (index + 1) * self.ps]
            returned = self.pool.register(seq.pages[index], parent, page_tokens)
            self.truth[seq.pages[index]] = tuple(seq.tokens[: (index + 1) * self.ps])
            self.on_register(seq, index, returned)
            seq.hashes.append(returned)

    def pick(self, index: int) -> int:
        return sorted(self.seqs)[index % len(self.seqs)]

    # -- rules -----------------------------------------------------------------

    def admit(self, tokens: list[int]) -> ModelSeq | None:
        """Take cached pages and allocate the rest, or back off; computes nothing."""
        # Leave one prompt token uncached: its logits start the reply.
        pages, hashes = self.match(tokens, max_pages=(len(tokens) - 1) // self.ps)
        seq = ModelSeq(tokens[: len(pages) * self.ps], list(pages), list(hashes))
        seq_id = self.next_seq_id
        self.next_seq_id += 1
        self.seqs[seq_id] = seq
        self.pool.acquire(pages)
        self.on_acquire(pages)
        need = pages_for(len(tokens), self.ps) - len(pages)
        if not self.pool.can_allocate(need):
            with pytest.raises(OutOfPagesError):
                self.pool.allocate(need)
            del self.seqs[seq_id]
            self.release(seq.pages)
            return None
        seq.pages += self.allocate(need)
        seq.tokens = list(tokens)
        return seq

    @rule(tokens=PROMPT)
    def start_sequence(self, tokens: list[int]) -> None:
        seq = self.admit(tokens)
        if seq is not None:
            self.register_full_pages(seq)

    @rule(tokens=PROMPT, copies=st.integers(2, 3))
    def broadcast(self, tokens: list[int], copies: int) -> None:
        """Several panes admitted in one step compute the same prompt."""
        admitted = [self.admit(tokens) for _ in range(copies)]
        for seq in admitted:
            if seq is not None:
                self.register_full_pages(seq)

    @precondition(lambda self: self.seqs)
    @rule(index=st.integers(0, 100), keep=st.integers(0, 100), extra=st.lists(TOKEN, max_size=4))
    def next_turn(self, index: int, keep: int, extra: list[int]) -> None:
        """A sequence ends; its conversation goes on (or regenerates) from a prefix of it."""
        seq = self.seqs.pop(self.pick(index))
        self.release(seq.pages)
        prompt = seq.tokens[: len(seq.tokens) - keep % (len(seq.tokens) + 1)] + extra
        if prompt:
            self.start_sequence(prompt)

    @precondition(lambda self: self.seqs)
    @rule(index=st.integers(0, 100), generated=st.lists(TOKEN, min_size=1, max_size=6))
    def extend_sequence(self, index: int, generated: list[int]) -> None:
        seq = self.seqs[self.pick(index)]
        for token in generated:
            if len(seq.tokens) == len(seq.pages) * self.ps:
                if not self.pool.can_allocate(1):
                    return
                seq.pages += self.allocate(1)
            seq.tokens.append(token)
            self.register_full_pages(seq)

    @precondition(lambda self: self.seqs)
    @rule(index=st.integers(0, 100))
    def fork_sequence(self, index: int) -> None:
        seq = self.seqs[self.pick(index)]
        full = len(seq.tokens) // self.ps
        shared = seq.pages[:full]
        self.pool.acquire(shared)
        self.seqs[self.next_seq_id] = ModelSeq(
            seq.tokens[: full * self.ps], list(shared), list(seq.hashes[:full])
        )
        self.next_seq_id += 1

    @precondition(lambda self: self.seqs)
    @rule(index=st.integers(0, 100))
    def finish_sequence(self, index: int) -> None:
        seq = self.seqs.pop(self.pick(index))
        self.release(seq.pages)

    @rule(n=st.integers(0, 8))
    def allocation_pressure(self, n: int) -> None:
        if self.pool.can_allocate(n):
            self.blobs.append(self.allocate(n))
            return
        before = (self.pool.stats, self.pool.evictable_in_lru_order())
        with pytest.raises(OutOfPagesError):
            self.pool.allocate(n)
        assert (self.pool.stats, self.pool.evictable_in_lru_order()) == before

    @precondition(lambda self: self.blobs)
    @rule(index=st.integers(0, 100))
    def release_pressure(self, index: int) -> None:
        blob = self.blobs.pop(index % len(self.blobs))
        self.release(blob)

    @rule()
    def reset_prefix_cache(self) -> None:
        used = self.pool.num_used
        cached = self.pool.num_cached
        free = self.pool.num_free
        self.pool.reset_prefix_cache()
        assert self.pool.num_cached == 0
        assert self.pool.num_used == used
        assert self.pool.num_free == free + cached
        self.on_reset()

    @rule(
        tokens=st.lists(TOKEN, max_size=10),
        max_pages=st.none() | st.integers(0, 5),
    )
    def query(self, tokens: list[int], max_pages: int | None) -> None:
        self.match(tokens, max_pages)

    # -- invariants ------------------------------------------------------------

    @invariant()
    def accounting(self) -> None:
        pool = self.pool
        held = self.holders()
        for page_id in range(pool.num_pages):
            assert pool.refcount(page_id) == held[page_id]
        lru = pool.evictable_in_lru_order()
        assert len(set(lru)) == len(lru)
        assert not set(lru) & set(held), "a page is both used and evictable"
        assert pool.num_used == len(held)
        assert pool.num_cached == len(lru)
        assert pool.num_free + pool.num_cached + pool.num_used == pool.num_pages
        assert pool.num_allocatable == pool.num_free + pool.num_cached
        stats = pool.stats
        assert stats == PagePoolStats(
            pages_total=pool.num_pages,
            pages_used=pool.num_used,
            pages_cached=pool.num_cached,
            pages_free=pool.num_free,
            prefix_queries_pages=self.queried_pages,
            prefix_hit_pages=self.hit_pages,
        )

    @invariant()
    def cached_pages_hold_computed_content(self) -> None:
        for page_id in self.pool.evictable_in_lru_order():
            assert page_id in self.truth

    def teardown(self) -> None:
        if not hasattr(self, "pool"):
            return
        for seq_id in list(self.seqs):
            self.release(self.seqs.pop(seq_id).pages)
        while self.blobs:
            self.release(self.blobs.pop())
        assert self.pool.num_used == 0
        assert self.pool.num_free + self.pool.num_cached == self.pool.num_pages


class ParentBlindPoolMachine(PoolSafetyMachine):
    pool_class = ParentBlindPool


class PoolReferenceMachine(PoolSafetyMachine):
    """Adds an exact reference: the cache maps each full token prefix to a page."""

    pool_class = PagePool

    def __init__(self) -> None:
        super().__init__()
        self.ref_owner: dict[tuple[int, ...], int] = {}  # the page match_prefix finds
        self.ref_duplicates: dict[tuple[int, ...], list[int]] = {}  # live, oldest first
        self.ref_prefix: dict[int, tuple[int, ...]] = {}  # owners and duplicates
        self.ref_lru: OrderedDict[int, None] = OrderedDict()

    def on_acquire(self, pages: list[int]) -> None:
        for page_id in pages:
            self.ref_lru.pop(page_id, None)

    def on_allocate(self, new: list[int], from_free: int) -> None:
        assert new[from_free:] == list(self.ref_lru)[: len(new) - from_free]
        for page_id in new[from_free:]:
            del self.ref_lru[page_id]
            del self.ref_owner[self.ref_prefix.pop(page_id)]

    def on_release(self, dropped: list[int], joined: list[int]) -> None:
        expected_joined = []
        for page_id in dropped:
            prefix = self.ref_prefix.get(page_id)
            if prefix is None:
                continue
            duplicates = self.ref_duplicates.get(prefix)
            if not duplicates:
                expected_joined.append(page_id)
                continue
            if self.ref_owner[prefix] == page_id:
                self.ref_owner[prefix] = duplicates.pop()  # the newest one inherits
            else:
                duplicates.remove(page_id)
            if not duplicates:
                del self.ref_duplicates[prefix]
            del self.ref_prefix[page_id]
        assert joined == expected_joined
        for page_id in joined:
            self.ref_lru[page_id] = None

    def on_register(self, seq: ModelSeq, index: int, returned: PageHash) -> None:
        parent = seq.hashes[-1] if seq.hashes else None
        page_tokens = seq.tokens[index * self.ps : (index + 1) * self.ps]
        assert returned == self.pool.hash_page(parent, page_tokens)
        if not self.pool.enable_prefix_cache:
            return
        page_id = seq.pages[index]
        prefix = tuple(seq.tokens[: (index + 1) * self.ps])
        self.ref_prefix[page_id] = prefix
        owner = self.ref_owner.get(prefix)
        if owner is None:
            self.ref_owner[prefix] = page_id
        elif owner in self.ref_lru:
            del self.ref_lru[owner]
            del self.ref_prefix[owner]
            self.ref_owner[prefix] = page_id
        else:
            self.ref_duplicates.setdefault(prefix, []).append(page_id)

    def on_reset(self) -> None:
        for page_id in self.ref_lru:
            del self.ref_owner[self.ref_prefix.pop(page_id)]
        self.ref_lru.clear()

    def expected_match(self, tokens: list[int], max_pages: int | None) -> list[int]:
        limit = len(tokens) // self.ps
        if max_pages is not None:
            limit = max(0, min(limit, max_pages))
        pages = []
        for i in range(limit):
            page_id = self.ref_owner.get(tuple(tokens[: (i + 1) * self.ps]))
            if page_id is None:
                break
            pages.append(page_id)
        return pages

    @invariant()
    def matches_reference(self) -> None:
        assert self.pool.evictable_in_lru_order() == list(self.ref_lru)
        for page_id, prefix in self.ref_prefix.items():
            assert self.truth[page_id] == prefix
        held = self.holders()
        for prefix in self.ref_duplicates:
            assert held[self.ref_owner[prefix]] > 0, "a duplicate outlives its registered page"
        # Every registered page is reachable: its parents were not evicted first.
        for prefix, page_id in self.ref_owner.items():
            pages, _ = self.match(list(prefix), None)
            assert len(pages) * self.ps == len(prefix) and pages[-1] == page_id


# 100 runs of 50 steps: planted bugs (pages released head first, a cached
# page acquired but left evictable) were found within 80; 250 cost ~30 s.
_machine_settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

TestPoolAgainstReference = PoolReferenceMachine.TestCase
TestPoolAgainstReference.settings = _machine_settings
TestPoolUnderHashCollisions = PoolSafetyMachine.TestCase
TestPoolUnderHashCollisions.settings = _machine_settings
TestPoolUnderChainBlindHash = ParentBlindPoolMachine.TestCase
TestPoolUnderChainBlindHash.settings = _machine_settings


# -- scenarios -------------------------------------------------------------------


def run_sequence(pool: PagePool, tokens: list[int]) -> tuple[list[int], list[PageHash]]:
    """Admit a prompt like the scheduler: reuse cached pages, compute the rest."""
    size = pool.page_size
    pages, hashes = pool.match_prefix(tokens, max_pages=(len(tokens) - 1) // size)
    pool.acquire(pages)
    pages = pages + pool.allocate(pages_for(len(tokens), size) - len(pages))
    for index in range(len(hashes), len(tokens) // size):
        parent = hashes[-1] if hashes else None
        page_tokens = tokens[index * size : (index + 1) * size]
        hashes.append(pool.register(pages[index], parent, page_tokens))
    return pages, hashes


def test_second_turn_reuses_the_first_turns_pages() -> None:
    pool = PagePool(num_pages=16, page_size=4)
    turn1 = list(range(100, 116))  # prompt and reply: four full pages
    pages1, hashes1 = run_sequence(pool, turn1)
    pool.release(pages1)
    assert pool.num_cached == 4 and pool.num_used == 0

    before = pool.stats
    turn2 = turn1 + [7, 8, 9, 10, 11]
    matched, hashes = pool.match_prefix(turn2, max_pages=(len(turn2) - 1) // 4)
    assert matched == pages1 and hashes == hashes1
    pool.acquire(matched)
    assert pool.num_cached == 0
    assert [pool.refcount(p) for p in matched] == [1, 1, 1, 1]
    # Turn 1 asked about its 3 leading pages and found none.
    assert (before.prefix_queries_pages, before.prefix_hit_pages) == (3, 0)
    assert pool.stats.prefix_queries_pages == 3 + 5
    assert pool.stats.prefix_hit_pages == 4
    assert pool.stats.prefix_hit_rate == pytest.approx(0.5)


def test_match_leaves_a_token_to_compute_when_capped() -> None:
    pool = PagePool(num_pages=8, page_size=2)
    tokens = [1, 2, 3, 4]
    pages, _ = run_sequence(pool, tokens)
    pool.release(pages)
    matched, _ = pool.match_prefix(tokens, max_pages=(len(tokens) - 1) // 2)
    assert matched == pages[:1]
    assert pool.match_prefix(tokens)[0] == pages
    assert pool.match_prefix(tokens, max_pages=0) == ([], [])


def test_fork_shares_the_prefix_pages() -> None:
    pool = PagePool(num_pages=8, page_size=2)
    pages, hashes = run_sequence(pool, [5, 6, 7, 8, 9])
    shared = pages[:2]
    pool.acquire(shared)
    assert [pool.refcount(p) for p in pages] == [2, 2, 1]
    fork_tail = pool.allocate(1)
    pool.register(fork_tail[0], hashes[-1], [1, 1])

    pool.release(pages)
    assert [pool.refcount(p) for p in pages] == [1, 1, 0]
    assert pool.num_used == 3
    assert pages[2] not in pool.evictable_in_lru_order()  # its page was never full
    pool.release(shared + fork_tail)
    assert pool.num_used == 0
    assert pool.evictable_in_lru_order() == [fork_tail[0], pages[1], pages[0]]
    assert pool.match_prefix([5, 6, 7, 8, 1, 1])[0] == shared + fork_tail


def test_allocation_takes_free_pages_before_cached_ones() -> None:
    pool = PagePool(num_pages=6, page_size=2)
    pages, _ = run_sequence(pool, [1, 2, 3, 4])
    pool.release(pages)
    assert pool.num_free == 4 and pool.num_cached == 2

    taken = pool.allocate(4)
    assert not set(taken) & set(pages)
    assert pool.num_cached == 2
    assert pool.match_prefix([1, 2, 3, 4])[0] == pages

    more = pool.allocate(1)
    assert more == [pages[1]]  # the tail went back to the LRU first
    assert pool.match_prefix([1, 2, 3, 4])[0] == pages[:1]
    assert pool.evictable_in_lru_order() == [pages[0]]


def test_shared_head_outlives_its_tails() -> None:
    pool = PagePool(num_pages=5, page_size=1)
    a, _ = run_sequence(pool, [1, 2, 3])
    b, _ = run_sequence(pool, [1, 2, 4])
    assert b[:2] == a[:2]
    pool.release(a)
    pool.release(b)
    # a's tail, then b's tail, then the shared head, deepest page first.
    assert pool.evictable_in_lru_order() == [a[2], b[2], a[1], a[0]]
    assert pool.allocate(3)[1:] == [a[2], b[2]]
    assert pool.match_prefix([1, 2, 9])[0] == a[:2]


def test_acquiring_a_cached_page_makes_it_most_recent_on_release() -> None:
    pool = PagePool(num_pages=4, page_size=1)
    a, _ = run_sequence(pool, [1])
    b, _ = run_sequence(pool, [2])
    pool.release(a)
    pool.release(b)
    assert pool.evictable_in_lru_order() == [a[0], b[0]]
    pool.acquire(a)
    pool.release(a)
    assert pool.evictable_in_lru_order() == [b[0], a[0]]


def test_collision_never_returns_a_page_with_other_tokens() -> None:
    pool = FirstTokenBlindPool(num_pages=8, page_size=2)
    a, a_hashes = run_sequence(pool, [1, 5, 7, 7, 0])
    pool.release(a)
    assert pool.hash_page(None, [2, 5]) == a_hashes[0]

    assert pool.match_prefix([2, 5, 7, 7]) == ([], [])
    b, b_hashes = run_sequence(pool, [2, 5, 7, 7, 0])
    assert set(b).isdisjoint(a[:2])
    # b's first page collides with a's: b's chain is never cached, so its
    # second page cannot be found behind a's first one either.
    assert b_hashes[0] < 0 and b_hashes[1] == b_hashes[0]
    assert pool.match_prefix([1, 5, 7, 7])[0] == a[:2]
    assert pool.match_prefix([2, 5, 7, 7]) == ([], [])

    pool.release(b)
    assert pool.num_used == 0
    assert pool.num_cached == 2
    assert pool.evictable_in_lru_order() == [a[1], a[0]]


def test_collision_with_a_constant_hash() -> None:
    class ConstantHashPool(PagePool):
        def hash_page(self, parent: PageHash | None, token_ids: Sequence[int]) -> PageHash:
            return 7

    pool = ConstantHashPool(num_pages=4, page_size=1)
    a, _ = run_sequence(pool, [3, 4])
    pool.release(a)
    # One hash names page a[0]; page a[1] stayed unregistered.
    assert pool.evictable_in_lru_order() == [a[0]]
    assert pool.match_prefix([3, 3])[0] == a[:1]  # a[0] holds 3 at position 0 only
    assert pool.match_prefix([4]) == ([], [])


def test_same_prefix_computed_twice_in_one_step() -> None:
    pool = PagePool(num_pages=10, page_size=2)
    prompt = [1, 2, 3, 4, 5]
    # Both are admitted before either has registered anything.
    a, a_hashes = pool.allocate(3), []
    b, b_hashes = pool.allocate(3), []
    for pages, hashes in ((a, a_hashes), (b, b_hashes)):
        for index in range(2):
            parent = hashes[-1] if hashes else None
            hashes.append(pool.register(pages[index], parent, prompt[2 * index : 2 * index + 2]))
    assert a_hashes == b_hashes
    assert pool.match_prefix(prompt)[0] == a[:2]

    # b's reply fills its third page, chained on the hash it shares with a.
    b_hashes.append(pool.register(b[2], b_hashes[-1], [5, 6]))
    assert pool.match_prefix([1, 2, 3, 4, 5, 6])[0] == [a[0], a[1], b[2]]

    pool.release(b)
    assert pool.evictable_in_lru_order() == [b[2]]
    assert pool.num_free == 10 - 6 + 2
    pool.release(a)
    assert pool.num_used == 0
    assert pool.evictable_in_lru_order() == [b[2], a[1], a[0]]
    assert pool.num_free == 7


def test_duplicate_takes_over_when_the_registered_page_goes_first() -> None:
    pool = PagePool(num_pages=8, page_size=2)
    prompt = [1, 2, 3, 4, 5]
    a, a_hashes = pool.allocate(3), []
    b, b_hashes = pool.allocate(3), []
    for pages, hashes in ((a, a_hashes), (b, b_hashes)):
        for index in range(2):
            parent = hashes[-1] if hashes else None
            hashes.append(pool.register(pages[index], parent, prompt[2 * index : 2 * index + 2]))
    b_hashes.append(pool.register(b[2], b_hashes[-1], [5, 6]))

    pool.release(a)  # a finishes first; b still needs its prefix
    assert pool.num_cached == 0 and pool.num_free == 5
    assert pool.match_prefix(prompt)[0] == b[:2]
    pool.allocate(pool.num_allocatable)  # pressure evicts whatever it may
    assert pool.match_prefix([1, 2, 3, 4, 5, 6])[0] == b


def test_recomputed_last_prompt_page_replaces_its_cached_copy() -> None:
    pool = PagePool(num_pages=4, page_size=2)
    first, _ = run_sequence(pool, [1, 2, 3, 4])
    pool.release(first)
    assert pool.evictable_in_lru_order() == [first[1], first[0]]

    # Regenerating the reply: the last prompt page is computed again.
    again, _ = run_sequence(pool, [1, 2, 3, 4])
    assert again[0] == first[0] and again[1] != first[1]
    assert pool.num_cached == 0 and pool.num_free == 2
    assert pool.match_prefix([1, 2, 3, 4])[0] == again
    pool.release(again)
    assert pool.evictable_in_lru_order() == [again[1], again[0]]


def test_registering_again_with_the_same_content_is_a_no_op() -> None:
    pool = PagePool(num_pages=2, page_size=2)
    [page] = pool.allocate(1)
    first = pool.register(page, None, [1, 2])
    assert pool.register(page, None, [1, 2]) == first
    with pytest.raises(ValueError, match="already registered"):
        pool.register(page, None, [1, 3])


def test_reset_drops_cached_content_only() -> None:
    pool = PagePool(num_pages=6, page_size=1)
    kept, _ = run_sequence(pool, [1, 2])
    gone, _ = run_sequence(pool, [3, 4])
    pool.release(gone)
    pool.reset_prefix_cache()
    assert pool.num_cached == 0 and pool.num_free == 4 and pool.num_used == 2
    assert pool.match_prefix([3, 4]) == ([], [])
    assert pool.match_prefix([1, 2])[0] == kept
    pool.release(kept)
    assert pool.evictable_in_lru_order() == [kept[1], kept[0]]


def test_disabled_prefix_cache_caches_nothing() -> None:
    pool = PagePool(num_pages=4, page_size=2, enable_prefix_cache=False)
    pages, hashes = run_sequence(pool, [1, 2, 3, 4])
    assert hashes == [pool.hash_page(None, [1, 2]), pool.hash_page(hashes[0], [3, 4])]
    pool.release(pages)
    assert pool.num_free == 4 and pool.num_cached == 0
    assert pool.match_prefix([1, 2, 3, 4]) == ([], [])
    assert pool.stats.prefix_queries_pages == 0


def test_hash_is_chained_and_stable() -> None:
    pool = PagePool(num_pages=1, page_size=3)
    root = pool.hash_page(None, [1, 2, 3])
    assert root == PagePool(num_pages=5, page_size=3).hash_page(None, (1, 2, 3))
    assert 0 <= root < 2**128
    assert pool.hash_page(root, [1, 2, 3]) != root
    assert pool.hash_page(root, [1, 2, 3]) != pool.hash_page(root + 1, [1, 2, 3])
    assert pool.hash_page(None, [1, 2, 4]) != root
    with pytest.raises(ValueError, match="3 token ids"):
        pool.hash_page(None, [1, 2])


def test_misuse_raises_and_changes_nothing() -> None:
    pool = PagePool(num_pages=4, page_size=2)
    [held] = pool.allocate(1)
    snapshot = pool.stats

    with pytest.raises(OutOfPagesError, match="only 3 of 4"):
        pool.allocate(4)
    with pytest.raises(ValueError, match="negative"):
        pool.allocate(-1)
    with pytest.raises(ValueError, match="is free"):
        pool.acquire([held, (held + 1) % 4])
    with pytest.raises(ValueError, match="released 2 time"):
        pool.release([held, held])
    with pytest.raises(ValueError, match="outside the pool"):
        pool.release([-1])
    with pytest.raises(ValueError, match="outside the pool"):
        pool.refcount(4)
    with pytest.raises(ValueError, match="2 token ids"):
        pool.register(held, None, [1, 2, 3])
    with pytest.raises(ValueError, match="not held"):
        pool.register((held + 1) % 4, None, [1, 2])
    assert pool.stats == snapshot
    assert pool.refcount(held) == 1

    pool.release([held])
    with pytest.raises(ValueError, match="holds 0 reference"):
        pool.release([held])
    with pytest.raises(ValueError, match="at least one page"):
        PagePool(num_pages=0, page_size=2)
