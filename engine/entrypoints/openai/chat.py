"""POST /v1/chat/completions: messages (and tools) through the model's chat
template, answered as one JSON object or streamed as `chat.completion.chunk`
events; `response_format` and a forced tool call decoded under a grammar."""

from __future__ import annotations

import dataclasses

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine import reasoning
from engine.entrypoints.openai import protocol as proto
from engine.entrypoints.openai import responses
from engine.entrypoints.openai.choices import (
    check_constraint, encode_prompt, reply_limit, start_choices, wait_for_outputs,
)
from engine.entrypoints.openai.models import ServedModels
from engine.entrypoints.openai.request_body import read_request
from engine.entrypoints.openai.streaming import stream_choices
from engine.entrypoints.openai.tools import (
    ToolFieldError, forced_call_constraint, special_markers, text_with_markers,
)


@dataclasses.dataclass(slots=True, frozen=True)
class _Answer:
    text: str
    finish_reason: str


async def create_chat_completion(request: Request, models: ServedModels) -> Response:
    # Decoded and checked on a worker thread: a large body must not stall other clients.
    req = await read_request(request, proto.parse_chat_request)
    engine = models.require(req.model)
    offered = req.tools.offered if req.tools is not None else ()
    ids = await encode_prompt(engine, req.messages, "messages", parse_special_in_content=req.parse_special_tokens,
                              tools=offered, template_kwargs=req.chat_template_kwargs)
    fmt = engine.tokenizer.tool_call_format if offered else None
    # The request parser refuses response_format beside offered tools: one grammar at most.
    constraint, constraint_param = req.response_format, "response_format"
    if fmt is not None and req.tools is not None:
        try:
            forced = forced_call_constraint(req.tools, fmt, engine.tokenizer)
        except ToolFieldError as exc:
            raise proto.APIError(400, str(exc), param=exc.param, code="invalid_schema") from None
        if forced is not None:
            constraint, constraint_param = forced, "tools"
    if constraint is not None:
        await check_constraint(engine, constraint, constraint_param)
    sampling = dataclasses.replace(req.sampling, constraint=constraint)
    # Unasked, a chat reply may run until the context (or the KV cache) is full.
    limit = reply_limit(engine, len(ids), sampling.max_tokens, None)
    choices = start_choices(engine, [ids], sampling, [limit], param="messages", model=req.model,
                            constraint_param=constraint_param)
    head = responses.ResponseHead.new("chatcmpl", req.model)
    thinks = reasoning.reply_start(engine.tokenizer, ids)
    # A marker that is a special token (Mistral's [TOOL_CALLS]) is no part of a reply's text.
    markers = {token_id: text for text, token_id in special_markers(fmt, engine.tokenizer).items()} if fmt else {}
    one_call = req.tools is not None and not req.tools.parallel
    if req.stream:
        chunks = responses.ChatChunks(head, req.include_usage, thinks, fmt, markers, one_call)
        return stream_choices(choices, chunks, req.model)
    outputs = await wait_for_outputs(request, choices, req.model)
    if outputs is None:
        return Response(status_code=proto.CLIENT_CLOSED_REQUEST)
    answers = [_Answer(text_with_markers(o.text, o.token_ids, markers, engine.tokenizer.decode), o.finish_reason)
               for o in outputs]
    return JSONResponse(responses.chat_completion(head, answers, choices.usage(), thinks, fmt, one_call))
