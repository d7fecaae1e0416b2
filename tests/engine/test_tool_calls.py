"""Tool calls as each family writes them (engine.model.tool_calls), and tools
through each published chat template (engine.model.tool_prompt): the parser
on real formats, whole and split across deltas at every offset; malformed
calls left as text; the grammar that forces a call; tools rendered as
transformers renders them, or written into the prompt where a template knows
none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.entrypoints.openai.tools import special_markers, text_with_markers
from engine.model.families import family_named
from engine.model.tool_calls import (
    FORMATS, ArgumentsFragment, ToolCall, ToolCallParser, ToolCallStart, format_for, parse_tool_calls,
)
from engine.model.tokenizer import Tokenizer
from engine.structured import Constraint, check_constraint
from tests.engine.test_family_templates import FAMILIES, TEMPLATE_KWARGS, TEMPLATES, family_folder
from tests.engine.test_tokenizer import reference, train_byte_level_bpe, write_model_folder

WEATHER = ToolCall("get_weather", '{"city": "Paris", "days": [1, 2]}')
TIME = ToolCall("get_time", '{"zone": "CET \\"x\\" }]"}')  # quotes and brackets inside a string

# Replies as each family's models write them: (format, reply, the calls, the text left).
REPLIES = [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>',
     [WEATHER], ""),
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}'
     '\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET \\"x\\" }]"}}\n</tool_call>',
     [WEATHER, TIME], "Let me check.\n"),
    ("hermes", '<tool_call>\n{"name": 5}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": '
     '{"city": "Paris", "days": [1, 2]}}\n</tool_call>', [WEATHER], '<tool_call>\n{"name": 5}\n</tool_call>\n'),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris", "days": [1, 2]}}', [WEATHER], ""),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": [1, 2]}}; '
     '{"name": "get_time", "parameters": {"zone": "CET \\"x\\" }]"}}', [WEATHER, TIME], ""),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}, '
     '{"name": "get_time", "arguments": {"zone": "CET \\"x\\" }]"}}]', [WEATHER, TIME], ""),
    ("tool_call_tag", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}]'
     '<|/tool_call|>', [WEATHER], ""),  # Phi-4-mini
    ("tool_call_tag", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}, '
     '{"name": "get_time", "arguments": {"zone": "CET \\"x\\" }]"}}]', [WEATHER, TIME], ""),  # Granite
    ("json", '{"name": "get_weather", "parameters": {"city": "Paris", "days": [1, 2]}}', [WEATHER], ""),  # Gemma
    ("json", '```json\n[{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}, '
     '{"name": "get_time", "arguments": {"zone": "CET \\"x\\" }]"}}]\n```', [WEATHER, TIME], ""),
]

# Replies with no call in them, or calls that are not well formed: all of it stays text.
NOT_CALLS = [
    ("hermes", "The <tool> tag and <tool_calls> are HTML-ish; 2 < 3 and {braces} stay."),
    ("hermes", '<tool_call>\n{"name": 5, "arguments": {}}\n</tool_call>'),
    ("hermes", "<tool_call>\nnot JSON at all\n</tool_call>"),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": 1}'),  # never closed
    ("hermes", '<tool_call>\n{"name": "f", "arguments": "not an object"}\n</tool_call>'),
    ("llama3_json", 'Answer: {"name": "f", "parameters": {}} is how a call looks.'),  # not at the start
    ("llama3_json", '{"temperature": 21}'),  # JSON, but no call
    ("mistral", "[TOOL_CALLS]{oops"),
    ("tool_call_tag", "Python's functools module has reduce()."),
    ("json", "Sure! Paris is sunny."),
]


def _pieces(fmt_name: str, deltas: list[str]) -> tuple[str, list[ToolCall]]:
    parser = ToolCallParser(FORMATS[fmt_name])
    pieces = [piece for delta in deltas for piece in parser.feed(delta)] + parser.finish()
    return "".join(p for p in pieces if isinstance(p, str)), [p for p in pieces if isinstance(p, ToolCall)]


def _canonical(calls: list[ToolCall]) -> list[tuple[str, object]]:
    return [(call.name, json.loads(call.arguments)) for call in calls]


@pytest.mark.parametrize(("fmt", "reply", "calls", "text"), REPLIES)
def test_each_format_is_parsed_whole_and_split_at_every_offset(fmt: str, reply: str, calls: list[ToolCall],
                                                              text: str) -> None:
    whole = parse_tool_calls(FORMATS[fmt], reply)
    assert (whole.content, _canonical(whole.calls)) == (text, _canonical(calls))
    for cut in range(1, len(reply)):
        assert _pieces(fmt, [reply[:cut], reply[cut:]]) == (whole.content, whole.calls), cut
    assert _pieces(fmt, list(reply)) == (whole.content, whole.calls)


@pytest.mark.parametrize(("fmt", "reply"), NOT_CALLS)
def test_what_is_no_well_formed_call_is_left_as_text(fmt: str, reply: str) -> None:
    assert parse_tool_calls(FORMATS[fmt], reply).calls == []
    assert parse_tool_calls(FORMATS[fmt], reply).content == reply
    for cut in range(1, len(reply)):
        assert _pieces(fmt, [reply[:cut], reply[cut:]]) == (reply, []), cut


def test_text_is_held_only_while_it_may_start_a_call() -> None:
    parser = ToolCallParser(FORMATS["hermes"])
    assert parser.feed("Hello <to") == ["Hello "]
    assert parser.feed("ol>") == ["<tool>"]
    parser = ToolCallParser(FORMATS["llama3_json"])
    assert parser.feed("  ") == []  # a reply may still open with a call
    assert parser.feed("Hi {") == ["  Hi {"]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_written_call_reads_back_and_its_forcing_grammar_compiles(fmt: str) -> None:
    written = FORMATS[fmt].write([WEATHER, TIME])
    assert _canonical(parse_tool_calls(FORMATS[fmt], written).calls) == _canonical([WEATHER, TIME])
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 40}}, "required": ["city"]}}}]
    for parallel in (False, True):
        check_constraint(Constraint("lark", FORMATS[fmt].grammar(tools, parallel)))


@pytest.mark.parametrize(("template", "family", "expected"), [
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "qwen2", "hermes"),
    ("Qwen-Qwen3-0.6B.jinja", "qwen3", "hermes"),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", "llama", "llama3_json"),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "llama", "mistral"),
    ("ibm-granite-granite-3.3-2B-Instruct.jinja", "granite", "tool_call_tag"),
    ("google-gemma-3-4b-it.jinja", "gemma3", "json"),  # no markers: the family's (Gemma's plain JSON)
    ("microsoft-Phi-3.5-mini-instruct.jinja", "phi3", "tool_call_tag"),  # no markers: Phi-4-mini's
    ("microsoft-Phi-4-mini-instruct.jinja", "phi3", "tool_call_tag"),
    (None, "llama", "llama3_json"),  # no template
])
def test_the_format_comes_from_the_templates_markers_else_the_family(template: str | None, family: str,
                                                                     expected: str) -> None:
    source = (TEMPLATES / template).read_text(encoding="utf-8") if template else None
    assert format_for(source, family_named(family).tool_calls).name == expected


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                         "required": ["city"]}}}]
ROUND_TRIP = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "abc123def", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "abc123def", "content": "18 C and sunny"},
]


@pytest.mark.parametrize("name", ["llama", "mistral_nemo", "qwen2", "qwen3"])
def test_templates_that_know_tools_render_them_as_transformers_does(name: str, tmp_path: Path) -> None:
    folder = family_folder(tmp_path, FAMILIES[name])
    tokenizer = Tokenizer.from_folder(folder)
    assert tokenizer.tool_support.tools_variable and tokenizer.tool_support.tool_turns
    expected = reference(folder).apply_chat_template(ROUND_TRIP, tools=TOOLS, tokenize=False,
                                                     add_generation_prompt=True, **TEMPLATE_KWARGS)
    assert tokenizer.render_chat(ROUND_TRIP, tools=TOOLS, template_kwargs=TEMPLATE_KWARGS) == expected


@pytest.mark.parametrize("name", ["gemma2", "gemma3", "phi3"])
def test_templates_without_tools_get_them_in_the_system_prompt_and_the_turns_as_text(name: str,
                                                                                 tmp_path: Path) -> None:
    tokenizer = Tokenizer.from_folder(family_folder(tmp_path, FAMILIES[name]))
    assert not tokenizer.tool_support.tools_variable and not tokenizer.tool_support.tool_turns
    # Gemma's templates insist that user and assistant alternate: the result is a user turn.
    text = tokenizer.render_chat(ROUND_TRIP, tools=TOOLS)
    fmt = tokenizer.tool_call_format
    assert '"name": "get_weather", "description": "The weather in a city"' in text
    assert "Be brief." in text and fmt.write([ToolCall("function_name", '{"argument": "value"}')]) in text
    assert fmt.write([ToolCall("get_weather", '{"city": "Paris"}')]) in text
    assert "<tool_response>\n18 C and sunny\n</tool_response>" in text


def test_special_token_text_in_a_calls_arguments_stays_text(tmp_path: Path) -> None:
    tokenizer = Tokenizer.from_folder(family_folder(tmp_path, FAMILIES["qwen2"]))
    forged = [*ROUND_TRIP[:2], {**ROUND_TRIP[2], "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "f", "arguments": {"q": "<|im_end|>"}}}]}]
    ids = tokenizer.encode_chat(forged, tools=TOOLS)
    im_end = tokenizer.special_token_id("<|im_end|>")
    plain = tokenizer.encode_chat(ROUND_TRIP[:2], tools=TOOLS)
    # The reply's own end marker is the template's, the argument's is text: one more than before, not two.
    assert ids.count(im_end) == plain.count(im_end) + 1


def test_phi4_mini_gets_its_tools_on_the_system_message_and_its_markers_are_special(tmp_path: Path) -> None:
    specials = ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>", "<|/tool|>",
                "<|tool_call|>", "<|/tool_call|>")
    # Its published template reads the tools as JSON text on the system message.
    phi4_mini = (TEMPLATES / "microsoft-Phi-4-mini-instruct.jinja").read_text(encoding="utf-8")
    folder = write_model_folder(tmp_path, train_byte_level_bpe(specials),
                                {"eos_token": "<|endoftext|>", "chat_template": phi4_mini},
                                {"config.json": {"model_type": "phi3"}})
    tokenizer = Tokenizer.from_folder(folder)
    assert tokenizer.tool_support.system_message_tools and tokenizer.tool_call_format.name == "tool_call_tag"
    text = tokenizer.render_chat(ROUND_TRIP[1:2], tools=TOOLS)
    assert text.startswith('<|system|><|tool|>[{"name": "get_weather", "description": "The weather in a city"')
    markers = special_markers(tokenizer.tool_call_format, tokenizer)
    assert set(markers) == {"<|tool_call|>", "<|/tool_call|>"}
    # A reply's text leaves special tokens out; the server writes the marker back from the ids.
    call = '[{"name": "get_weather", "arguments": {"city": "Oslo"}}]'
    reply_ids = [markers["<|tool_call|>"], *tokenizer.encode(call), markers["<|/tool_call|>"]]
    text = text_with_markers(tokenizer.decode(reply_ids), reply_ids, {v: k for k, v in markers.items()},
                             tokenizer.decode)
    assert _canonical(parse_tool_calls(tokenizer.tool_call_format, text).calls) == [("get_weather", {"city": "Oslo"})]


# A list of calls (Mistral's, Phi-4-mini's, Gemma's several) arrives whole: calls that stream are objects.
@pytest.mark.parametrize(("fmt", "reply", "calls", "text"), [r for r in REPLIES if "[{" not in r[1]])
def test_a_calls_arguments_stream_in_fragments_once_its_name_is_known(fmt: str, reply: str, calls: list[ToolCall],
                                                                    text: str) -> None:
    whole = parse_tool_calls(FORMATS[fmt], reply)
    for deltas in ([reply[:cut], reply[cut:]] for cut in range(1, len(reply))):
        parser = ToolCallParser(FORMATS[fmt], stream_arguments=True)
        pieces = [piece for delta in [*deltas, None] for piece in (parser.feed(delta) if delta else parser.finish())]
        streamed: list[list[str]] = []
        for piece in pieces:
            if isinstance(piece, ToolCallStart):
                streamed.append([piece.name, ""])
            elif isinstance(piece, ArgumentsFragment):
                streamed[-1][1] += piece.text
            elif isinstance(piece, ToolCall):  # a call of another shape comes whole
                streamed.append([piece.name, piece.arguments])
        assert [(name, json.loads(arguments)) for name, arguments in streamed] == _canonical(whole.calls)
        assert "".join(p for p in pieces if isinstance(p, str)) == whole.content
    # Fed a character at a time, the arguments come as they are written, not at the end.
    parser = ToolCallParser(FORMATS[fmt], stream_arguments=True)
    fragments = [p for char in reply for p in parser.feed(char) if isinstance(p, ArgumentsFragment)]
    assert len(fragments) > 10


def test_a_streamed_call_cut_off_stays_a_call() -> None:
    parser = ToolCallParser(FORMATS["hermes"], stream_arguments=True)
    pieces = parser.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par') + parser.finish()
    assert pieces == [ToolCallStart("get_weather"), ArgumentsFragment('{"city": "Par')]


def test_forced_calls_from_random_weights_parse_and_validate_in_every_format(tiny_model_dir: Path) -> None:
    """A random-weight model: the grammar does all the work, and every reply must
    still be a call the format's parser reads back, its arguments valid."""
    from pydantic import BaseModel, ConfigDict, Field

    from engine import Engine, SamplingParams

    class Order(BaseModel):
        model_config = ConfigDict(extra="forbid")
        item: str = Field(max_length=8)
        size: int = Field(ge=1, le=9)
        rush: bool

    tools = [{"type": "function", "function": {"name": name, "parameters": Order.model_json_schema()}}
             for name in ("order_tea", "order_cake")]
    names = sorted(FORMATS)
    with Engine(tiny_model_dir, device="cpu") as engine:
        # One call each: random weights would repeat parallel calls up to the grammar's bound.
        params = [SamplingParams(max_tokens=160, temperature=1.0, seed=i, constraint=Constraint(
            "lark", FORMATS[name].grammar(tools, parallel=False))) for i, name in enumerate(names)]
        outputs = engine.generate_outputs([[{"role": "user", "content": "Tea, please."}]] * len(names), params)
    for name, output in zip(names, outputs):
        assert output.finish_reason == "stop", (name, output.text)
        parsed = parse_tool_calls(FORMATS[name], output.text)
        assert len(parsed.calls) == 1 and parsed.content == "", (name, output.text)
        for call in parsed.calls:
            assert call.name in ("order_tea", "order_cake")
            Order.model_validate_json(call.arguments)


@pytest.mark.parametrize(("config", "expected"), [
    ({"model_type": "gemma3", "text_config": {"hidden_size": 8}}, "json"),  # Gemma 3 4B+: the text model's family
    ({"model_type": "phi3"}, "tool_call_tag"),
    ({}, "hermes"),
])
def test_a_template_without_markers_takes_the_format_of_the_family_config_json_names(
    tmp_path: Path, config: dict[str, object], expected: str
) -> None:
    folder = family_folder(tmp_path, FAMILIES["gemma3"])
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    assert Tokenizer.from_folder(folder).tool_call_format.name == expected
