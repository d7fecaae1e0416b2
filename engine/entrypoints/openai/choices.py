"""The engine side of one API call: its prompts encoded, its reply limits, one
engine request per choice, and waiting for them (or for the client to leave).

A choice of `n` is one engine request; the first choice of a prompt is
prefilled alone and the others are submitted once its prompt pages are in the
prefix cache, so all of them share those pages instead of computing the
prompt n times. A client that goes away (a closed stream or an abandoned
non-streaming call) aborts its requests, which frees their KV pages at the
engine's next step.

Nothing here waits on the model: requests are submitted to the engine and
what its thread pushes back arrives through `loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.types import Receive

from engine.entrypoints.openai import protocol as proto
from engine.entrypoints.openai import responses
from engine.entrypoints.openai.protocol import APIError, SamplingFields
from engine.errors import EngineClosedError, EngineError, PromptError
from engine.params import InvalidSamplingParams, SamplingParams
from engine.structured import Constraint, InvalidConstraint

if TYPE_CHECKING:
    from engine.core.sequence import RequestOutput, StreamEvent
    from engine.llm import Engine, RequestHandle


class Choices:
    """The engine requests behind one API call: `n` choices for each prompt,
    choice index `prompt_index * n + i` as the API numbers them.

    Events from the engine thread land in an asyncio queue via
    `call_soon_threadsafe`; `events()` hands them out in arrival order.
    `abort()` stops whatever has not finished and is safe to call repeatedly.
    """

    def __init__(self, engine: Engine, prompts: list[list[int]], params: list[SamplingParams], n: int) -> None:
        self.engine = engine
        self.prompts = prompts
        self.params = params  # one per choice
        self.n = n
        self.total = len(prompts) * n
        self.outputs: list[RequestOutput | None] = [None] * self.total
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[int, StreamEvent]] = asyncio.Queue()
        self._handles: dict[int, RequestHandle] = {}
        self._deferred: dict[int, list[int]] = {}  # prompt index -> choices not yet submitted
        self._closed = False

    def start(self) -> None:
        """Submit the first choice of every prompt (all choices when sharing
        cannot help). Raises the engine's error for a prompt that cannot run,
        having aborted anything this call already submitted."""
        share = self.n > 1 and self.engine.pool.enable_prefix_cache
        try:
            for p in range(len(self.prompts)):
                first = p * self.n
                self._submit(first)
                rest = list(range(first + 1, first + self.n))
                # Only full pages are shared, so a prompt under one page gains nothing from waiting.
                if share and len(self.prompts[p]) > self.engine.pool.page_size:
                    self._deferred[p] = rest
                else:
                    for choice in rest:
                        self._submit(choice)
        except BaseException:
            self.abort()
            raise

    def _submit(self, choice: int) -> None:
        queue, loop = self._queue, self._loop

        def sink(event: StreamEvent) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (choice, event))
            except RuntimeError:  # the server's loop is gone: nobody is listening
                pass

        prompt = self.prompts[choice // self.n]
        self._handles[choice] = self.engine.submit(prompt, self.params[choice], sink)

    async def events(self) -> AsyncIterator[tuple[int, StreamEvent]]:
        finished = 0
        while finished < self.total:
            choice, event = await self._queue.get()
            # The first event of a prompt's first choice means its prompt has
            # been computed and its full pages registered in the prefix cache.
            rest = self._deferred.pop(choice // self.n, None) if choice % self.n == 0 else None
            if rest and not self._closed:
                try:
                    for other in rest:
                        self._submit(other)
                except BaseException:  # the engine closed meanwhile
                    self.abort()
                    raise
            if event.output is not None:
                self.outputs[choice] = event.output
                finished += 1
            yield choice, event

    async def collect(self) -> list[RequestOutput]:
        async for _ in self.events():
            pass
        return [o for o in self.outputs if o is not None]

    def abort(self) -> None:
        self._closed = True
        self._deferred.clear()
        for choice, handle in self._handles.items():
            if self.outputs[choice] is None:
                self.engine.abort(handle)

    def usage(self) -> dict[str, Any]:
        # The prompt is billed once per prompt, not once per choice, as OpenAI does.
        firsts = [self.outputs[p * self.n] for p in range(len(self.prompts))]
        return responses.usage(
            prompt_tokens=sum(len(ids) for ids in self.prompts),
            completion_tokens=sum(len(o.token_ids) for o in self.outputs if o is not None),
            cached_tokens=sum(o.metrics.cached_prompt_tokens for o in firsts if o is not None),
        )

    def first_error(self) -> Exception | None:
        return next((o.error for o in self.outputs if o is not None and o.error is not None), None)


# -- before the engine: prompts, limits, parameters ---------------------------------


async def encode_prompt(
    engine: Engine, prompt: Any, param: str, *, parse_special_in_content: bool = False,
    tools: Sequence[Mapping[str, Any]] = (), template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Token ids of one prompt (messages, text or ids; chat messages with the
    `tools` the model is offered); a 400 naming `param` when it cannot run.

    A prompt longer than the context could ever hold is refused before it is
    tokenized: a 20 MB prompt would otherwise cost seconds of CPU and
    gigabytes of memory only to be refused afterwards."""
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], Mapping) \
            and len(prompt) > engine.max_context:  # token ids
        raise APIError(400, f"The prompt has {len(prompt):,} tokens, more than the model's context "
                       f"of {engine.max_context} tokens; shorten it.",
                       param=param, code="context_length_exceeded")
    # Chat templates and tokenizers are CPU work: keep them off the event loop.
    try:
        return await asyncio.to_thread(
            _encode_bounded, engine, prompt, param, parse_special_in_content, tools, template_kwargs or {}
        )
    except PromptError as exc:
        raise APIError(400, str(exc), param=param, code="invalid_prompt") from None
    except EngineError as exc:  # a broken chat template (TokenizerError)
        raise APIError(500, str(exc), type="server_error", code="template_error") from None


def _encode_bounded(
    engine: Engine, prompt: Any, param: str, parse_special_in_content: bool, tools: Sequence[Mapping[str, Any]],
    template_kwargs: Mapping[str, Any],
) -> list[int]:
    chars = prompt_chars(prompt) + sum(len(json.dumps(tool)) for tool in tools)
    limit = engine.max_context * max_chars_per_token(engine.tokenizer)
    if chars > limit:
        raise APIError(400, f"The prompt is {chars:,} characters long; the model's context of "
                       f"{engine.max_context} tokens holds at most about {limit:,} characters of it. "
                       "Shorten it.", param=param, code="context_length_exceeded")
    if tools or template_kwargs:
        return engine.tokenizer.encode_chat(prompt, parse_special_in_content=parse_special_in_content,
                                            tools=tools or None, template_kwargs=template_kwargs)
    return engine.encode_prompt(prompt, parse_special_in_content=parse_special_in_content)


def prompt_chars(prompt: Any) -> int:
    """The characters of text in a prompt (a string, or chat messages' contents and
    tool calls); 0 for token ids."""
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list):
        return sum(len(m.get("content") or "") + (len(json.dumps(m["tool_calls"])) if m.get("tool_calls") else 0)
                   for m in prompt if isinstance(m, Mapping))
    return 0


def max_chars_per_token(tokenizer: Any) -> int:
    """A bound on the characters of text one token stands for: twice the longest token's
    decoded text, plus one. Twice, because decoding a lone token may drop the space a
    word-start marker stands for, and a normalizer may drop characters (accents) before
    tokenizing. So a text longer than max_context times this needs more tokens than the
    context has. Measured once per tokenizer (about 50 ms for a 50k vocabulary)."""
    with _MEASURE_LOCK:
        measured = _LONGEST_TOKEN_CHARS.get(tokenizer)
        if measured is None:
            measured = max((len(tokenizer.decode([i], skip_special_tokens=False))
                            for i in range(tokenizer.vocab_size)), default=1)
            _LONGEST_TOKEN_CHARS[tokenizer] = measured
    return 2 * (measured + 1)


_MEASURE_LOCK = threading.Lock()
_LONGEST_TOKEN_CHARS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def reply_limit(engine: Engine, prompt_len: int, requested: int | None, default: int | None) -> int:
    """The reply length limit: what the client asked, else `default`, else all
    the room the context and the KV cache leave after the prompt."""
    if requested is not None:
        return requested
    stats = engine.stats()
    room = min(engine.max_context, stats.pages_total * stats.page_size + 1) - prompt_len
    return max(1, room if default is None else min(default, room))


def with_recommendation(fields: SamplingFields, recommended: Mapping[str, int | float]) -> SamplingFields:
    """`fields` with each sampling field the request left out taken from the
    model's recommendation (Engine.recommended_sampling), as vLLM does by
    default; a field the model does not recommend keeps OpenAI's default."""
    taken = {k: v for k, v in recommended.items() if k not in fields.given}
    return dataclasses.replace(fields, **taken) if taken else fields


def params_per_choice(fields: SamplingFields, max_tokens: Sequence[int], n: int) -> list[SamplingParams]:
    """One SamplingParams per choice (`n` for each prompt's limit in
    `max_tokens`); with a seed, choice i of a prompt draws with seed + i so
    that the choices differ yet the call is reproducible."""
    out = []
    for limit in max_tokens:
        for i in range(n):
            try:
                out.append(SamplingParams(
                    max_tokens=limit,
                    temperature=fields.temperature,
                    top_p=fields.top_p,
                    top_k=fields.top_k,
                    min_p=fields.min_p,
                    repetition_penalty=fields.repetition_penalty,
                    seed=None if fields.seed is None else fields.seed + i,
                    stop=fields.stop,
                    ignore_eos=fields.ignore_eos,
                    constraint=fields.constraint,
                ))
            except InvalidSamplingParams as exc:  # the parser checks ranges first; a safety net
                raise APIError(400, str(exc), code="invalid_value") from None
    return out


def start_choices(
    engine: Engine,
    prompts: list[list[int]],
    fields: SamplingFields,
    limits: Sequence[int],
    *,
    param: str,
    model: str,
    constraint_param: str | None = None,
) -> Choices:
    """Submit `fields.n` choices for each prompt (`limits[i]` tokens at most
    for prompt i). A prompt that cannot run is a 400 naming `param`, and
    nothing of this call stays submitted."""
    fields = with_recommendation(fields, engine.recommended_sampling)
    choices = Choices(engine, prompts, params_per_choice(fields, limits, fields.n), fields.n)
    try:
        choices.start()
    except PromptError as exc:  # RequestTooLargeError included: prompt + max_tokens too long
        raise APIError(400, str(exc), param=param, code="context_length_exceeded") from None
    except InvalidConstraint as exc:  # checked before (check_constraint); a safety net
        raise APIError(400, str(exc), param=constraint_param, code="invalid_schema") from None
    except EngineClosedError as exc:
        raise proto.engine_failure(exc, model) from None
    return choices


async def check_constraint(engine: Engine, constraint: Constraint, param: str) -> None:
    """A 400 naming `param` for a constraint the engine cannot run (an unsupported
    schema feature, a compile limit), compiled off the event loop."""
    try:
        await asyncio.to_thread(engine.check_constraint, constraint)
    except InvalidConstraint as exc:
        raise APIError(400, str(exc), param=param, code="invalid_schema") from None


# -- waiting for the answer -----------------------------------------------------------


async def wait_for_outputs(request: Request, choices: Choices, model: str) -> list[RequestOutput] | None:
    """Every choice's output, in choice order; None (and everything aborted)
    when the client hangs up first, so nobody's pages are held for a dead
    socket. An engine that failed or closed under the call is an APIError."""
    done = asyncio.ensure_future(choices.collect())
    gone = asyncio.ensure_future(_until_disconnected(request.receive))
    try:
        await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not done.done():
            choices.abort()
            return None
        try:
            outputs = done.result()
        except EngineError as exc:
            raise proto.engine_failure(exc, model) from None
    finally:
        # Cancelled (server shutdown) or finished: nothing may keep running for this call.
        if not done.done():
            choices.abort()
        for task in (done, gone):
            task.cancel()
    error = choices.first_error()
    if error is not None:
        raise proto.engine_failure(error, model)
    return outputs


async def _until_disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
