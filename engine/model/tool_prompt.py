"""Tools in a prompt: what a chat template does with them, and a conversation
with tools made into one the template can render.

Templates differ. Qwen's, Llama 3's and Mistral's render the `tools`
variable, the assistant's `tool_calls` and `role: "tool"` results themselves
(transformers' conventions, which Tandem follows: a call's arguments are an
object, not JSON text). Phi-4-mini's reads the tools as JSON text on the
system message. Gemma's, Phi-3.5's and plain ChatML ones know no tools at
all; for those, as llama.cpp and Ollama do, the tools and how to call them
are written into the system prompt, earlier calls into the assistant's text
in the model's format, and results into a user turn. Probe conversations
(`probe_support`) tell which case a template is, once per tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.model.tool_calls import ToolCall, ToolCallFormat

_PROBE_TOOL = "tandem_probe_tool"
_PROBE_CALL = "tandem_probe_call"
_PROBE_RESULT = "tandem probe result"
_PROBE_CALL_ID = "tandem001"  # nine letters and digits: Mistral's template checks


@dataclass(frozen=True, slots=True)
class ToolTemplateSupport:
    tools_variable: bool  # renders the `tools` variable
    system_message_tools: bool  # renders tools given as JSON text on the system message (Phi-4-mini)
    tool_turns: bool  # renders assistant `tool_calls` and `role: "tool"` results


NO_SUPPORT = ToolTemplateSupport(False, False, False)


Render = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str | None]


def probe_support(render: Render) -> ToolTemplateSupport:
    """What a template does with tools; `render(messages, tools)` renders with a
    generation prompt, or returns None where the template refuses the conversation."""
    tool = {"type": "function", "function": {
        "name": _PROBE_TOOL, "description": "Probe.", "parameters": {"type": "object", "properties": {}}}}
    hi = {"role": "user", "content": "Hi"}
    variable = render([hi], [tool]) or ""
    system = render([{"role": "system", "content": "Probe.", "tools": json.dumps([tool["function"]])}, hi], None) or ""
    turns = render([hi, assistant_with_calls("", [(_PROBE_CALL_ID, ToolCall(_PROBE_CALL, "{}"))]),
                    {"role": "tool", "tool_call_id": _PROBE_CALL_ID, "name": _PROBE_CALL, "content": _PROBE_RESULT}],
                   [tool]) or ""
    return ToolTemplateSupport(
        tools_variable=_PROBE_TOOL in variable,
        system_message_tools=_PROBE_TOOL in system,
        tool_turns=_PROBE_CALL in turns and _PROBE_RESULT in turns,
    )


def assistant_with_calls(content: str, calls: Sequence[tuple[str, ToolCall]]) -> dict[str, Any]:
    """An assistant message with tool calls ((id, call) pairs) as templates read it:
    transformers' shape, the arguments an object."""
    return {"role": "assistant", "content": content, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": _arguments(call.arguments)}}
        for call_id, call in calls
    ]}


def has_tool_turns(messages: Sequence[Mapping[str, Any]]) -> bool:
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def prepare(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    support: ToolTemplateSupport,
    fmt: ToolCallFormat,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, the `tools` variable) for the template, given what it supports."""
    out = [dict(m) for m in messages]
    if has_tool_turns(out) and not support.tool_turns:
        out = _turns_as_text(out, fmt)
    if not tools:
        return out, None
    if support.tools_variable:
        return out, [dict(t) for t in tools]
    if support.system_message_tools:
        functions = json.dumps([t["function"] for t in tools], ensure_ascii=False)
        if out and out[0].get("role") == "system":
            out[0]["tools"] = functions
        else:
            out.insert(0, {"role": "system", "content": "", "tools": functions})
        return out, None
    instructions = tool_instructions(tools, fmt)
    if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
        out[0]["content"] = f"{out[0]['content']}\n\n{instructions}" if out[0]["content"] else instructions
    else:
        out.insert(0, {"role": "system", "content": instructions})
    return out, None


def tool_instructions(tools: Sequence[Mapping[str, Any]], fmt: ToolCallFormat) -> str:
    """The tools, and how to call them in `fmt`, for a system prompt."""
    listed = "\n".join(json.dumps(dict(t), ensure_ascii=False) for t in tools)
    example = fmt.write([ToolCall("function_name", '{"argument": "value"}')])
    return (
        "You may call one or more of these tools (each one's arguments are described by a JSON Schema):\n"
        f"<tools>\n{listed}\n</tools>\n\n"
        f"To call a tool, reply with only the call, written like this:\n{example}\n"
        "The results will come back in the next message. If no tool helps, answer directly."
    )


def _turns_as_text(messages: list[dict[str, Any]], fmt: ToolCallFormat) -> list[dict[str, Any]]:
    """Calls written into the assistant's text in the model's format, and results
    as a user turn (consecutive ones joined, and joined to a user message after them)."""
    out: list[dict[str, Any]] = []
    from_results = False
    for message in messages:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            calls = [ToolCall(c["function"]["name"], _arguments_text(c["function"].get("arguments")))
                     for c in message["tool_calls"]]
            content = message.get("content") or ""
            out.append({"role": "assistant", "content": f"{content}\n{fmt.write(calls)}".lstrip("\n")})
            from_results = False
        elif role == "tool" or (role == "user" and from_results):
            text = message.get("content") or ""
            if role == "tool":
                text = f"<tool_response>\n{text}\n</tool_response>"
            if from_results:
                out[-1]["content"] += f"\n{text}"
            else:
                out.append({"role": "user", "content": text})
            from_results = True
        else:
            out.append(message)
            from_results = False
    return out


def _arguments(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
