"""POST /v1/completions: the legacy text completion, one or several raw
prompts (text or token ids, no chat template), answered as one JSON object
or streamed as `text_completion` events."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.entrypoints.openai import protocol as proto
from engine.entrypoints.openai import responses
from engine.entrypoints.openai.choices import encode_prompt, reply_limit, start_choices, wait_for_outputs
from engine.entrypoints.openai.models import ServedModels
from engine.entrypoints.openai.request_body import read_request
from engine.entrypoints.openai.streaming import stream_choices


async def create_completion(request: Request, models: ServedModels) -> Response:
    # Decoded and checked on a worker thread: a large body must not stall other clients.
    req = await read_request(request, proto.parse_completion_request)
    engine = models.require(req.model)
    prompts = [await encode_prompt(engine, p, "prompt") for p in req.prompts]
    # Unasked, a completion is 16 tokens long, as OpenAI's is.
    limits = [
        reply_limit(engine, len(ids), req.sampling.max_tokens, proto.COMPLETIONS_DEFAULT_MAX_TOKENS)
        for ids in prompts
    ]
    choices = start_choices(engine, prompts, req.sampling, limits, param="prompt", model=req.model)
    head = responses.ResponseHead.new("cmpl", req.model)
    if req.stream:
        return stream_choices(choices, responses.CompletionChunks(head, req.include_usage), req.model)
    outputs = await wait_for_outputs(request, choices, req.model)
    if outputs is None:
        return Response(status_code=proto.CLIENT_CLOSED_REQUEST)
    return JSONResponse(responses.completion(head, outputs, choices.usage()))
