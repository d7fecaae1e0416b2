"""KV page accounting and the persistent prefix cache.

The model runner owns the KV tensors, one pool indexed by page id; this
module decides which page ids hold what. A page is always in exactly one
state:

- used: its reference count is above zero (running sequences hold it);
- cached: count zero, but it still holds the K/V of a full page whose
  content is registered under a chained hash, so a later prompt with the
  same prefix can take it back; these form an LRU and are evicted oldest
  first when no free page is left;
- free: count zero and no content worth keeping.

Content addressing. A full page is named by `hash_page(parent, token_ids)`:
a 128-bit BLAKE2b digest of the parent page's hash and this page's token
ids, so one hash stands for the whole prefix up to the end of the page. A
lookup also compares the stored parent hash and token ids with the query's,
and a registered page never outlives, under eviction, the parent page it was
computed after (see below), so a parent hash still names the content it named
at registration. Together these make a hit exact even where hashes collide;
a collision only costs hits.

Duplicates. Two sequences may compute the same full page independently (a
prompt's last page, which each pane of a broadcast computes itself and which
is recomputed on a full hit so that a token is left to sample from; the
scheduler has the other shared pages computed once). One page is
registered under the hash; the others are live duplicates. The registered
page is never left evictable while a duplicate is in use: when it is released
first, a duplicate takes over its hash and it is freed; a cached page is
likewise replaced by a newly registered duplicate. So a parent page always
outlives, under eviction, the cached pages chained on it, and every
registered page stays reachable from the first page of its prefix.

Every operation costs O(1) or O(pages it touches). Not thread-safe: the
engine thread is the only caller.
"""

from __future__ import annotations

from array import array
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import blake2b

PageHash = int
"""Chained content hash of one full page, from `PagePool.hash_page`: a
non-negative 128-bit int, stable across processes. `PagePool.register` may
instead return a negative value, which marks a chain that met a hash
collision and is never cached; chain from it like from any other hash."""

_DIGEST_BYTES = 16
# Signed and one byte wider than a digest so that poisoned (negative) parents
# encode too; no parent at all encodes as nothing, which cannot be confused
# with a parent because the token part has a fixed length.
_PARENT_BYTES = _DIGEST_BYTES + 1


class OutOfPagesError(Exception):
    """`PagePool.allocate` was asked for more pages than are free or evictable.

    The scheduler checks `PagePool.can_allocate` first, so this means a bug
    in the caller rather than a condition a user can cause.
    """


@dataclass(slots=True, frozen=True)
class PagePoolStats:
    """A snapshot of the pool. Prefix counters are in pages, since creation."""

    pages_total: int
    pages_used: int
    pages_cached: int
    pages_free: int
    prefix_queries_pages: int  # full pages that match_prefix was asked about
    prefix_hit_pages: int  # of those, pages it returned

    @property
    def prefix_hit_rate(self) -> float:
        if self.prefix_queries_pages == 0:
            return 0.0
        return self.prefix_hit_pages / self.prefix_queries_pages


@dataclass(slots=True)
class _PageContent:
    """What a registered page holds; its live duplicates share the record."""

    page_hash: PageHash
    parent: PageHash | None
    token_bytes: bytes


class PagePool:
    """Reference-counted KV pages with a persistent, LRU-evicted prefix cache.

    The scheduler's side of the contract, which the guarantees above rest on:
    admit a sequence with `match_prefix`, then `acquire` what it returned,
    then `allocate` the rest; `register` each page once its K/V is written
    and it is full, chaining on the value the previous `register` or
    `match_prefix` gave for the page before it; `release` all of a
    sequence's pages in one call, head first, when it finishes or is
    preempted.
    """

    def __init__(self, num_pages: int, page_size: int, enable_prefix_cache: bool = True) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError(
                f"a page pool needs at least one page of at least one token, "
                f"got num_pages={num_pages}, page_size={page_size}"
            )
        self.num_pages = num_pages
        self.page_size = page_size
        self.enable_prefix_cache = enable_prefix_cache
        self._refcount = [0] * num_pages
        self._content: list[_PageContent | None] = [None] * num_pages
        self._page_by_hash: dict[PageHash, int] = {}
        # Live pages holding the same content as the page a hash maps to.
        self._duplicates: dict[PageHash, dict[int, None]] = {}
        # A stack, reversed so that a fresh pool hands out pages 0, 1, 2, ...
        self._free = list(range(num_pages - 1, -1, -1))
        # Cached pages, least recently released first; values are unused.
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._poisoned_chains = 0
        self._queried_pages = 0
        self._hit_pages = 0

    # -- counts --------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._lru)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free) - len(self._lru)

    @property
    def num_allocatable(self) -> int:
        return len(self._free) + len(self._lru)

    @property
    def stats(self) -> PagePoolStats:
        return PagePoolStats(
            pages_total=self.num_pages,
            pages_used=self.num_used,
            pages_cached=self.num_cached,
            pages_free=self.num_free,
            prefix_queries_pages=self._queried_pages,
            prefix_hit_pages=self._hit_pages,
        )

    def refcount(self, page_id: int) -> int:
        self._check_page_id(page_id)
        return self._refcount[page_id]

    def evictable_in_lru_order(self) -> list[int]:
        """Cached pages, the next one `allocate` would evict first."""
        return list(self._lru)

    # -- allocation and references -------------------------------------------

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_allocatable

    def allocate(self, n: int) -> list[int]:
        """Take `n` pages with a reference count of one each.

        Free pages go first; only then are cached pages evicted, least
        recently released first, and their content forgotten. Raises
        `OutOfPagesError`, changing nothing, when fewer than `n` are free or
        evictable.
        """
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of pages ({n})")
        if n > self.num_allocatable:
            raise OutOfPagesError(
                f"asked for {n} KV pages but only {self.num_allocatable} of "
                f"{self.num_pages} are free or evictable"
            )
        pages: list[int] = []
        for _ in range(n):
            if self._free:
                page_id = self._free.pop()
            else:
                page_id, _ = self._lru.popitem(last=False)
                self._forget(page_id)
            self._refcount[page_id] = 1
            pages.append(page_id)
        return pages

    def acquire(self, page_ids: Sequence[int]) -> None:
        """Add one reference to each page; cached pages stop being evictable.

        Meant for pages returned by `match_prefix` and for sharing a running
        sequence's full pages with a fork. Acquire matched pages before
        allocating the rest of a prompt: allocation may evict cached pages,
        the matched ones included.
        """
        for page_id in page_ids:
            self._check_page_id(page_id)
            if self._refcount[page_id] == 0 and page_id not in self._lru:
                raise ValueError(
                    f"page {page_id} is free; only pages in use or cached "
                    f"(as returned by match_prefix) can be acquired"
                )
        for page_id in page_ids:
            if self._refcount[page_id] == 0:
                del self._lru[page_id]
            self._refcount[page_id] += 1

    def release(self, page_ids: Sequence[int]) -> None:
        """Drop one reference to each of a sequence's pages, given head first.

        The pages are released tail first. A page left without references
        joins the most recent end of the LRU if its content is registered (and
        no live duplicate takes it over), and the free pages otherwise.
        Releasing tail first makes a shared head more recent than the tails
        hanging off it, so eviction takes the tails first.
        """
        for page_id, count in Counter(page_ids).items():
            self._check_page_id(page_id)
            if self._refcount[page_id] < count:
                raise ValueError(
                    f"page {page_id} released {count} time(s) but holds "
                    f"{self._refcount[page_id]} reference(s)"
                )
        for page_id in reversed(page_ids):
            self._refcount[page_id] -= 1
            if self._refcount[page_id] == 0:
                self._park(page_id)

    # -- prefix cache ----------------------------------------------------------

    def hash_page(self, parent: PageHash | None, token_ids: Sequence[int]) -> PageHash:
        """The chained hash of one full page: its parent's hash and its tokens.

        `parent` is None for the first page of a sequence. The result does
        not depend on the process (no salted `hash()`), so it may be stored.
        """
        digest = blake2b(digest_size=_DIGEST_BYTES)
        if parent is not None:
            digest.update(parent.to_bytes(_PARENT_BYTES, "little", signed=True))
        digest.update(self._token_bytes(token_ids))
        return int.from_bytes(digest.digest(), "little")

    def match_prefix(
        self, token_ids: Sequence[int], max_pages: int | None = None
    ) -> tuple[list[int], list[PageHash]]:
        """The cached pages holding the longest full-page prefix of `token_ids`.

        Returns their page ids and chained hashes, head first, at most
        `max_pages` of them; the caller caps it so that at least one prompt
        token is left to compute logits from. Takes no references: the caller
        `acquire`s the pages it uses, before anything else changes the pool
        (an allocation could evict them). With the cache enabled, every call adds
        the full pages it was asked about and the pages it found to the
        stats, so call it once per admission of a sequence, not once per
        scheduling attempt. Returns nothing when the cache is disabled.
        """
        if not self.enable_prefix_cache:
            return [], []
        size = self.page_size
        num_pages = len(token_ids) // size
        if max_pages is not None:
            num_pages = max(0, min(num_pages, max_pages))
        page_ids: list[int] = []
        hashes: list[PageHash] = []
        parent: PageHash | None = None
        for start in range(0, num_pages * size, size):
            page_tokens = token_ids[start : start + size]
            page_hash = self.hash_page(parent, page_tokens)
            page_id = self._page_by_hash.get(page_hash)
            if page_id is None:
                break
            content = self._content[page_id]
            assert content is not None, "a hashed page lost its content"
            if content.parent != parent or content.token_bytes != self._token_bytes(page_tokens):
                break  # a hash collision: same name, other content
            page_ids.append(page_id)
            hashes.append(page_hash)
            parent = page_hash
        self._queried_pages += num_pages
        self._hit_pages += len(page_ids)
        return page_ids, hashes

    def register(self, page_id: int, parent: PageHash | None, token_ids: Sequence[int]) -> PageHash:
        """Record that held page `page_id` is full with `token_ids` after `parent`.

        Returns the value to pass as `parent` when registering the next page
        of the same sequence. Cases:

        - new content: the page becomes findable by `match_prefix` and, once
          released, stays cached until evicted;
        - content already registered to another page (two sequences computed
          the same prefix): returns the same hash, and pages chained on it are
          found after whichever page holds it. If the other page is in use,
          it keeps the hash and this one is a duplicate, freed when released
          (or taking the hash over if the other is released first); if the
          other is only cached, this page takes the hash and the other is
          freed;
        - hash already registered to other content (a collision) or a
          poisoned `parent`: nothing is registered and a negative, never
          matchable value is returned, so the rest of this sequence is never
          cached under someone else's prefix.

        With the prefix cache disabled nothing is registered and the hash is
        returned as is. Registering a page again with the same content is a
        no-op.
        """
        self._check_page_id(page_id)
        if self._refcount[page_id] == 0:
            raise ValueError(f"page {page_id} is not held by anyone and cannot be registered")
        token_bytes = self._token_bytes(token_ids)
        if parent is not None and parent < 0:
            return parent
        page_hash = self.hash_page(parent, token_ids)
        if not self.enable_prefix_cache:
            return page_hash
        content = self._content[page_id]
        if content is not None:
            if content != _PageContent(page_hash, parent, token_bytes):
                raise ValueError(f"page {page_id} is already registered with other content")
            return page_hash
        owner = self._page_by_hash.get(page_hash)
        if owner is None:
            self._content[page_id] = _PageContent(page_hash, parent, token_bytes)
            self._page_by_hash[page_hash] = page_id
            return page_hash
        theirs = self._content[owner]
        assert theirs is not None, "a hashed page lost its content"
        if theirs.parent != parent or theirs.token_bytes != token_bytes:
            self._poisoned_chains += 1
            return -self._poisoned_chains
        self._content[page_id] = theirs
        if self._refcount[owner] > 0:
            self._duplicates.setdefault(page_hash, {})[page_id] = None
        else:
            # A cached copy could be evicted from under the pages this live
            # one will have chained on it.
            del self._lru[owner]
            self._content[owner] = None
            self._free.append(owner)
            self._page_by_hash[page_hash] = page_id
        return page_hash

    def reset_prefix_cache(self) -> None:
        """Forget every cached page (they become free); pages in use keep theirs."""
        while self._lru:
            page_id, _ = self._lru.popitem(last=False)
            self._forget(page_id)
            self._free.append(page_id)

    # -- internals -------------------------------------------------------------

    def _park(self, page_id: int) -> None:
        """Move a page that nobody holds any more to the LRU or the free pages."""
        content = self._content[page_id]
        if content is None:
            self._free.append(page_id)
            return
        duplicates = self._duplicates.get(content.page_hash)
        if duplicates is None:
            self._lru[page_id] = None
            return
        if self._page_by_hash[content.page_hash] == page_id:
            heir, _ = duplicates.popitem()
            self._page_by_hash[content.page_hash] = heir
        else:
            del duplicates[page_id]
        if not duplicates:
            del self._duplicates[content.page_hash]
        self._content[page_id] = None
        self._free.append(page_id)

    def _forget(self, page_id: int) -> None:
        content = self._content[page_id]
        assert content is not None, "a cached page has no content"
        del self._page_by_hash[content.page_hash]
        self._content[page_id] = None

    def _token_bytes(self, token_ids: Sequence[int]) -> bytes:
        if len(token_ids) != self.page_size:
            raise ValueError(
                f"a full page has {self.page_size} token ids, got {len(token_ids)}"
            )
        return array("q", token_ids).tobytes()

    def _check_page_id(self, page_id: int) -> None:
        if not 0 <= page_id < self.num_pages:
            raise ValueError(f"page id {page_id} is outside the pool [0, {self.num_pages})")
