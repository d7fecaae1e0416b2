"""One request's state inside the engine, and the record it leaves behind."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.core.detokenizer import IncrementalDetokenizer
from engine.model.sampler import RequestSampler
from engine.params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # not holding pages (new, or preempted)
    RUNNING = "running"  # holding pages; prefilling or decoding
    FINISHED = "finished"


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    prompt_tokens: int = 0
    # Prompt tokens whose KV came from the prefix cache at admission (the
    # first admission; a recompute after preemption is not counted again),
    # pages another request computed while this one waited for them included:
    # the tokens this request did not compute.
    cached_prompt_tokens: int = 0
    preemptions: int = 0

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time


@dataclass(slots=True)
class RequestOutput:
    """What a finished (or failed, or aborted) request produced."""

    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated ids, a stopping end token included
    text: str
    finish_reason: str  # "stop" | "length" | "abort" | "error"
    metrics: RequestMetrics
    error: Exception | None = None


@dataclass(slots=True)
class StreamEvent:
    """Pushed from the engine thread to a request's sink after every step.

    Besides the delta it carries what a live per-request display shows, so a
    consumer never has to recompute it from timestamps.
    """

    request_id: int
    text: str  # new text since the previous event (may be "")
    token_ids: list[int]  # new generated ids since the previous event
    output: RequestOutput | None = None  # set on the request's last event
    num_generated: int = 0  # generated tokens so far, this event's included
    elapsed_s: float = 0.0  # seconds since the request arrived
    ttft_s: float | None = None  # time to first token, once known
    prompt_tokens: int = 0
    # Prompt tokens served from the prefix cache (known once admitted, else 0).
    cached_prompt_tokens: int = 0


EventSink = Callable[[StreamEvent], None]


@dataclass(slots=True, eq=False)
class Sequence:
    request_id: int
    prompt_ids: list[int]
    params: SamplingParams
    sampler: RequestSampler | None
    detokenizer: IncrementalDetokenizer
    sink: EventSink
    stop_token_ids: frozenset[int]
    # The request's grammar state (an llguidance LLMatcher at its start) when
    # its params carry a constraint; the sampler advances it.
    matcher: Any = None
    token_ids: list[int] = field(init=False)
    status: SequenceStatus = SequenceStatus.WAITING
    pages: list[int] = field(default_factory=list)
    # Chained hashes of the leading full pages already registered in the
    # prefix cache; len(page_hashes) <= len(pages).
    page_hashes: list[int] = field(default_factory=list)
    # Chained content hashes (PagePool.hash_page) of the leading full pages of
    # token_ids, filled lazily by the scheduler to find pages that another
    # running sequence is computing; token_ids only grow, so they stay true.
    content_hashes: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose K/V is in this sequence's pages
    finish_reason: str | None = None
    pending_text: str = ""
    pending_ids: list[int] = field(default_factory=list)
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(time.perf_counter()))

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_ids)
        self.metrics.prompt_tokens = len(self.prompt_ids)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - len(self.prompt_ids)

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed

    def generated_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_ids) :]

    def to_output(self, error: Exception | None = None) -> RequestOutput:
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=list(self.prompt_ids),
            token_ids=self.generated_ids(),
            text=self.detokenizer.text,
            finish_reason=self.finish_reason or "abort",
            metrics=self.metrics,
            error=error,
        )
