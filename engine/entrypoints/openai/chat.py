"""POST /v1/chat/completions: messages through the model's chat template,
answered as one JSON object or streamed as `chat.completion.chunk` events."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine import reasoning
from engine.entrypoints.openai import protocol as proto
from engine.entrypoints.openai.choices import encode_prompt, reply_limit, start_choices, wait_for_outputs
from engine.entrypoints.openai.models import ServedModels
from engine.entrypoints.openai.request_body import read_request
from engine.entrypoints.openai.streaming import stream_choices

async def create_chat_completion(request: Request, models: ServedModels) -> Response:
    # Decoded and checked on a worker thread: a large body must not stall other clients.
    req = await read_request(request, proto.parse_chat_request)
    engine = models.require(req.model)
    ids = await encode_prompt(engine, req.messages, "messages", parse_special_in_content=req.parse_special_tokens)
    # Unasked, a chat reply may run until the context (or the KV cache) is full.
    limit = reply_limit(engine, len(ids), req.sampling.max_tokens, None)
    choices = start_choices(engine, [ids], req.sampling, [limit], param="messages", model=req.model)
    head = proto.ResponseHead.new("chatcmpl", req.model)
    thinks = reasoning.reply_start(engine.tokenizer, ids)
    if req.stream:
        return stream_choices(choices, proto.ChatChunks(head, req.include_usage, thinks), req.model)
    outputs = await wait_for_outputs(request, choices, req.model)
    if outputs is None:
        return Response(status_code=proto.CLIENT_CLOSED_REQUEST)
    return JSONResponse(proto.chat_completion(head, outputs, choices.usage(), thinks))

