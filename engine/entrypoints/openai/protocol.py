"""The OpenAI API's requests, as the server reads them, and its errors.

Parsing turns a decoded JSON body into a `ChatRequest` or `CompletionRequest`
with every field checked; anything wrong raises `APIError`, which carries the
HTTP status and the OpenAI-style error body (`{"error": {"message", "type",
"param", "code"}}`); the other errors are built here too (a model not
served, an engine that failed or closed mid-answer, an unknown route).
Nothing here reads a socket or touches an engine; the handlers hand over
plain values.

Fields the API defines but this server cannot honour (logprobs, a
non-zero presence penalty...) are refused with a 400 that names them rather
than silently ignored: a client relying on them would otherwise get answers
that look right and are not. Fields it does not know at all are ignored, as
other OpenAI-compatible servers do, so newer clients keep working. Like vLLM,
it also takes `top_k`, `min_p`, `repetition_penalty` and `ignore_eos`
(send them with the `openai` client's `extra_body`).

`response_format`, `tools` and tool turns are read by tools.py. The bodies
of the answers (JSON, stream chunks, usage, model cards) are built in
responses.py.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.documents import user_message_with_documents
from engine.entrypoints.openai.file_parts import MAX_FILE_PARTS, FilePartError, document_from_file_part
from engine.entrypoints.openai.tools import (
    ToolFieldError, ToolRequest, ToolTypeError, parse_response_format, parse_tools, tool_turn,
)
from engine.errors import EngineClosedError
from engine.params import RECOMMENDABLE_FIELDS
from engine.structured import Constraint

log = logging.getLogger(__name__)

# OpenAI's own limit on `n`, here on every prompt's choices together (prompts x n):
# each choice is a request of its own in the engine.
MAX_CHOICES = 128
# Bounds on what one request may ask of the server; each refusal names the field
# and the bound. A chat of more messages than this is not a conversation; at ~240
# characters of markup each, the template's output stays within its sandbox's
# budget, so an ordinary template never fails because of how many there are.
MAX_MESSAGES = 4096
MAX_CONTENT_PARTS = 256  # per message
# Every stop string is searched for after every token on the engine's shared
# thread, so their number and length cost every client's replies.
MAX_STOP_SEQUENCES = 16
MAX_STOP_CHARS = 256
# Served ids are short slugs; a shown name or an alias is a file name at most.
MAX_MODEL_CHARS = 512
# chat_template_kwargs: a few named switches, not a second prompt.
MAX_TEMPLATE_KWARGS = 16
MAX_TEMPLATE_KWARG_CHARS = 4096
# How much of a client's text an error message quotes back.
_QUOTED_CHARS = 80
# The engine divides float32 logits by the penalty, so a tiny one overflows them
# (the sampler now makes them finite again, so the draw never fails). Far below
# any useful value (0.5 already makes the model loop): the API refuses what can
# only be a mistake rather than answer with one token forced forever.
MIN_REPETITION_PENALTY = 1e-6
# What the legacy completions endpoint generates when max_tokens is not given.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
# The status of a call whose client left before the answer (nginx's "client
# closed request"); nobody reads it.
CLIENT_CLOSED_REQUEST = 499

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


class APIError(Exception):
    """A request the server refuses, with the status and body to answer it with."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str, type: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass(slots=True)
class SamplingFields:
    """The sampling part of a request, still in the API's terms."""

    n: int = 1
    max_tokens: int | None = None  # None: the endpoint's default
    temperature: float = 1.0  # the API's default, not the engine's
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # The sampling fields the body gave; the others take the model's
    # recommendation where it has one (Engine.recommended_sampling), as vLLM does.
    given: frozenset[str] = frozenset()
    constraint: Constraint | None = None  # response_format's, or a forced tool call's grammar


@dataclass(slots=True)
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]  # a tool turn holds more than text (tools.tool_turn)
    sampling: SamplingFields
    stream: bool
    include_usage: bool
    # Tandem's extension: read special-token text inside message contents as
    # control tokens (the old behaviour); by default message text stays text.
    parse_special_tokens: bool = False
    tools: ToolRequest | None = None
    response_format: Constraint | None = None  # None: text
    # Variables for the chat template, as vLLM takes them (Qwen3's {"enable_thinking": false}).
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class CompletionRequest:
    model: str
    prompts: list[str | list[int]]  # one entry per prompt of a batch
    sampling: SamplingFields
    stream: bool
    include_usage: bool


# -- field checks ---------------------------------------------------------------


def _invalid(param: str, message: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


def _wrong_type(param: str, expected: str, value: Any) -> APIError:
    return APIError(
        400,
        f"Invalid type for '{param}': expected {expected}, but got {_json_type(value)}.",
        param=param,
        code="invalid_type",
    )


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(body: Mapping[str, Any], name: str, default: Any, low: int | None = None, high: int | None = None) -> Any:
    value = body.get(name)
    if value is None:
        return default
    # JSON has one number type: 16.0 is an integer to most clients.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not _is_int(value):
        raise _wrong_type(name, "an integer", value)
    if low is not None and value < low:
        raise _invalid(name, f"'{name}' must be at least {low}, got {value}.")
    if high is not None and value > high:
        raise _invalid(name, f"'{name}' must be at most {high}, got {value}.")
    return value


def _number(
    body: Mapping[str, Any],
    name: str,
    default: float,
    *,
    low: float,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _wrong_type(name, "a number", value)
    value = float(value)
    low_ok = value > low if low_open else value >= low
    high_ok = high is None or (value < high if high_open else value <= high)
    if not (math.isfinite(value) and low_ok and high_ok):
        lo = "(" if low_open else "["
        hi = ")" if high_open else "]"
        span = f"{lo}{low:g}, {'inf' if high is None else f'{high:g}'}{hi}"
        raise _invalid(name, f"'{name}' must be a number in {span}, got {body.get(name)!r}.")
    return value


def _bool(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _wrong_type(name, "a boolean", value)
    return value


def _too_many(param: str, what: str, count: int, limit: int, hint: str = "") -> APIError:
    return APIError(400, f"'{param}' holds {count:,} {what}; at most {limit:,} are allowed per request."
                    f"{(' ' + hint) if hint else ''}", param=param, code="array_above_max_length")


def _too_long(param: str, length: int, limit: int) -> APIError:
    return APIError(400, f"'{param}' is {length:,} characters long; at most {limit:,} are allowed.",
                    param=param, code="string_above_max_length")


def _quoted(text: str) -> str:
    """A client's string as an error message may repeat it: short, so that a huge
    value cannot make a huge answer."""
    return repr(text if len(text) <= _QUOTED_CHARS else text[:_QUOTED_CHARS] + "...")


def _model(body: Mapping[str, Any]) -> str:
    value = body.get("model")
    if value is None:
        raise APIError(400, "You must provide a model parameter.", param="model", code="missing_required_parameter")
    if not isinstance(value, str):
        raise _wrong_type("model", "a string", value)
    if len(value) > MAX_MODEL_CHARS:
        raise _too_long("model", len(value), MAX_MODEL_CHARS)
    return value


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and len(value) > MAX_STOP_SEQUENCES:
        raise _too_many("stop", "stop sequences", len(value), MAX_STOP_SEQUENCES)
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise _wrong_type("stop", "a string or an array of strings", value)
    if any(not s for s in value):
        raise _invalid("stop", "Stop sequences must not be empty strings.")
    longest = max(map(len, value), default=0)
    if longest > MAX_STOP_CHARS:
        raise APIError(400, f"A stop sequence is {longest:,} characters long; at most {MAX_STOP_CHARS:,} "
                       "are allowed.", param="stop", code="string_above_max_length")
    return tuple(value)


def _unsupported(body: Mapping[str, Any], name: str, neutral: tuple[Any, ...] = (None,), hint: str = "") -> None:
    value = body.get(name)
    if value not in neutral:
        raise APIError(
            400,
            f"'{name}' is not supported by this server.{(' ' + hint) if hint else ''}",
            param=name,
            code="unsupported_parameter",
        )


def _sampling(body: Mapping[str, Any], max_tokens_names: tuple[str, ...]) -> SamplingFields:
    max_tokens = None
    for name in max_tokens_names:  # the first one given wins
        max_tokens = _int(body, name, None, low=1)
        if max_tokens is not None:
            break
    _unsupported(body, "logit_bias", (None, {}))
    _unsupported(body, "presence_penalty", (None, 0, 0.0), "Use 'repetition_penalty' instead.")
    _unsupported(body, "frequency_penalty", (None, 0, 0.0), "Use 'repetition_penalty' instead.")
    return SamplingFields(
        n=_int(body, "n", 1, low=1, high=MAX_CHOICES),
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, low=0.0),
        top_p=_number(body, "top_p", 1.0, low=0.0, high=1.0, low_open=True),
        top_k=_int(body, "top_k", 0, low=0) if body.get("top_k") != -1 else 0,  # vLLM's "off" is -1
        min_p=_number(body, "min_p", 0.0, low=0.0, high=1.0, high_open=True),
        repetition_penalty=_number(body, "repetition_penalty", 1.0, low=MIN_REPETITION_PENALTY),
        seed=_int(body, "seed", None),
        stop=_stop(body),
        ignore_eos=_bool(body, "ignore_eos", False),
        given=frozenset(name for name in RECOMMENDABLE_FIELDS if body.get(name) is not None),
    )


def _stream_flags(body: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise _wrong_type("stream_options", "an object", options)
    if not stream:
        raise _invalid("stream_options", "'stream_options' is only allowed when 'stream' is true.")
    return stream, _bool(options, "include_usage", False)


def _require_object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise APIError(400, f"The request body must be a JSON object, not {_json_type(body)}.", code="invalid_body")
    return body


# -- requests -------------------------------------------------------------------


def parse_chat_request(body: Any) -> ChatRequest:
    body = _require_object(body)
    model = _model(body)
    raw = body.get("messages")
    if raw is None:
        raise APIError(400, "You must provide 'messages'.", param="messages", code="missing_required_parameter")
    if not isinstance(raw, list):
        raise _wrong_type("messages", "an array of message objects", raw)
    if not raw:
        raise _invalid("messages", "'messages' must contain at least one message.")
    if len(raw) > MAX_MESSAGES:
        raise _too_many("messages", "messages", len(raw), MAX_MESSAGES,
                        "Leave out older turns, as a chat app does when a conversation outgrows the context.")
    _check_file_part_count(raw)
    try:
        messages = [_message(m, f"messages[{i}]") for i, m in enumerate(raw)]
        tools, response_format = parse_tools(body), parse_response_format(body)
    except ToolFieldError as exc:
        raise _field_error(exc) from None
    if tools is not None and tools.choice != "none" and response_format is not None:
        raise _invalid("response_format", "'response_format' and 'tools' cannot be used together: a reply is "
                       "either a tool call or the JSON asked for. Set 'tool_choice' to 'none', or leave one out.")
    _unsupported(body, "logprobs", (None, False))
    _unsupported(body, "top_logprobs", (None, 0))
    stream, include_usage = _stream_flags(body)
    return ChatRequest(
        model=model,
        messages=messages,
        sampling=_sampling(body, ("max_completion_tokens", "max_tokens")),
        stream=stream,
        include_usage=include_usage,
        parse_special_tokens=_bool(body, "parse_special_tokens", False),
        tools=tools,
        response_format=response_format,
        chat_template_kwargs=_template_kwargs(body),
    )


def _template_kwargs(body: Mapping[str, Any]) -> dict[str, Any]:
    """`chat_template_kwargs`: names to plain values (null, booleans, numbers, short strings)."""
    value = body.get("chat_template_kwargs")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _wrong_type("chat_template_kwargs", "an object of template variables", value)
    if len(value) > MAX_TEMPLATE_KWARGS:
        raise _too_many("chat_template_kwargs", "template variables", len(value), MAX_TEMPLATE_KWARGS)
    for name, item in value.items():
        if not name.isidentifier() or len(name) > 64:
            raise _invalid("chat_template_kwargs", f"{_quoted(name)} is not a template variable name.")
        where = f"chat_template_kwargs.{name}"
        if isinstance(item, str) and len(item) > MAX_TEMPLATE_KWARG_CHARS:
            raise _too_long(where, len(item), MAX_TEMPLATE_KWARG_CHARS)
        if not (item is None or isinstance(item, (bool, int, str)) or (isinstance(item, float) and math.isfinite(item))):
            raise _wrong_type(where, "null, a boolean, a number or a string", item)
    return dict(value)


def _field_error(exc: ToolFieldError) -> APIError:
    if isinstance(exc, ToolTypeError):
        return _wrong_type(exc.param, exc.expected, exc.value)
    return APIError(400, str(exc), param=exc.param, code=exc.code)


def _message(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _wrong_type(where, "an object", value)
    role = value.get("role")
    if not isinstance(role, str):
        raise _wrong_type(f"{where}.role", "a string", role)
    if role not in _ROLES:
        hint = " Send a function's result as a 'tool' message." if role == "function" else ""
        raise _invalid(
            f"{where}.role",
            f"Unknown role {_quoted(role)} in {where}; expected one of system, developer, user, assistant, "
            f"tool.{hint}",
        )
    content = value.get("content")
    if content is None and role == "assistant":
        content = ""
    if isinstance(content, list):
        content = _content_parts(content, f"{where}.content", role)
    elif not isinstance(content, str):
        raise _wrong_type(f"{where}.content", "a string or an array of text and file parts", content)
    if role == "tool" or (role == "assistant" and value.get("tool_calls") not in (None, [])):
        return tool_turn(value, where, content)
    return {"role": _ROLES[role], "content": content}


def _content_parts(parts: list[Any], where: str, role: str) -> str:
    """The message's text: its file parts' documents first, in order (the form the window
    sends, engine.documents), then its text parts, a line apart."""
    if len(parts) > MAX_CONTENT_PARTS:
        raise _too_many(where, "content parts", len(parts), MAX_CONTENT_PARTS, "Join the texts into fewer parts.")
    texts = []
    documents = []
    for i, part in enumerate(parts):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise _wrong_type(f"{where}[{i}]", "a content part object with a 'type'", part)
        if part["type"] == "file":
            if role != "user":
                raise _invalid(f"{where}[{i}].type",
                               f"File parts are accepted in user messages only, not in {role} ones.")
            try:
                documents.append(document_from_file_part(part, f"{where}[{i}]"))
            except FilePartError as exc:
                raise APIError(400, str(exc), param=exc.param, code="invalid_file") from None
            continue
        if part["type"] != "text":
            raise _invalid(
                f"{where}[{i}].type",
                f"Content parts of type {_quoted(part['type'])} are not supported; this model reads text "
                "and file parts only.",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise _wrong_type(f"{where}[{i}].text", "a string", text)
        texts.append(text)
    return user_message_with_documents("\n".join(texts), documents)


def _check_file_part_count(messages: list[Any]) -> None:
    # Counted before any is read: each may start a reader process.
    count = sum(1 for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)
                for p in m["content"] if isinstance(p, dict) and p.get("type") == "file")
    if count > MAX_FILE_PARTS:
        raise _too_many("messages", "file parts", count, MAX_FILE_PARTS, "Send fewer documents per request.")


def parse_completion_request(body: Any) -> CompletionRequest:
    body = _require_object(body)
    model = _model(body)
    prompts = _prompts(body.get("prompt"))
    _unsupported(body, "echo", (None, False))
    _unsupported(body, "logprobs", (None,))
    _unsupported(body, "suffix", (None, ""))
    n = body.get("n", 1)
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise APIError(400, "'best_of' other than 'n' is not supported.", param="best_of",
                       code="unsupported_parameter")
    stream, include_usage = _stream_flags(body)
    sampling = _sampling(body, ("max_tokens",))
    if len(prompts) * sampling.n > MAX_CHOICES:
        raise APIError(
            400,
            f"'prompt' holds {len(prompts):,} prompts and 'n' is {sampling.n}: {len(prompts) * sampling.n:,} "
            f"choices; at most {MAX_CHOICES} (prompts times n) are allowed per request. "
            "Send the prompts in several requests.",
            param="n" if sampling.n > 1 else "prompt", code="array_above_max_length")
    return CompletionRequest(
        model=model,
        prompts=prompts,
        sampling=sampling,
        stream=stream,
        include_usage=include_usage,
    )


def _prompts(value: Any) -> list[str | list[int]]:
    """A string, a list of strings, a list of token ids, or a list of those lists."""
    if value is None:
        raise APIError(400, "You must provide a 'prompt'.", param="prompt", code="missing_required_parameter")
    if isinstance(value, str):
        prompts: list[Any] = [value]
    elif isinstance(value, list) and value and all(_is_int(t) for t in value):
        prompts = [value]
    elif isinstance(value, list) and value and all(
        isinstance(p, str) or (isinstance(p, list) and p and all(_is_int(t) for t in p)) for p in value
    ):
        prompts = list(value)
    else:
        raise _wrong_type(
            "prompt", "a string, an array of strings, or an array (or arrays) of token ids", value
        )
    if any(p == "" for p in prompts):
        raise _invalid("prompt", "The prompt must not be empty.")
    return prompts


def engine_failure(error: Exception, model: str | None = None) -> APIError:
    """The answer to a call whose engine failed under it: a 503 when the
    engine was closed (the model unloaded, the server stopping), else a 500."""
    if isinstance(error, EngineClosedError):
        what = f"The model '{model}'" if model else "The model"
        return APIError(503, f"{what} was unloaded, or the server is shutting down, before the "
                        "answer was complete; try again later.",
                        type="server_error", code="engine_closed")
    log.error("generation failed: %s", error)
    return APIError(500, f"The model failed while generating: {error}", type="server_error",
                    code="internal_error")


def model_not_found(model: str, served: Sequence[str]) -> APIError:
    """A request for a model id that is not served; the message names those that are."""
    if not served:
        serving = "it has no model loaded right now"
    elif len(served) == 1:
        serving = f"it serves '{served[0]}'"
    else:
        serving = "it serves " + ", ".join(f"'{i}'" for i in served[:10]) + (", ..." if len(served) > 10 else "")
    return APIError(
        404,
        f"The model '{model}' does not exist on this server or is not loaded; {serving} "
        "(see GET /v1/models).",
        param="model",
        code="model_not_found",
    )


def route_error(status: int, method: str, path: str, detail: str) -> APIError:
    """An HTTP-level refusal (unknown endpoint, wrong method) in the API's error shape."""
    if status == 404:
        message = f"Unknown endpoint {method} {path}; this server has " \
                  "/v1/models, /v1/chat/completions and /v1/completions."
    elif status == 405:
        message = f"{method} is not allowed on {path}."
    else:
        message = detail
    return APIError(status, message, code=None)


def internal_error(exc: BaseException) -> APIError:
    """The answer to a bug in the server itself (logged where it is caught)."""
    return APIError(500, f"Internal server error: {type(exc).__name__}: {exc}",
                    type="server_error", code="internal_error")
