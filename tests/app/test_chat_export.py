"""Export to Markdown and JSON, import of JSON, and the side-by-side comparison."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from app.store.export import ChatImportError, comparison_markdown, from_json, to_json, to_markdown
from app.workspace.conversation import Conversation
from app.workspace.messages import Message
from app.errors import AppError
from engine.params import SamplingParams
from tests.app.fixtures.chats import assert_same, build_conversation, stats


def exported(conv: Conversation) -> dict[str, Any]:
    """to_json through real JSON text, as a file would carry it."""
    return json.loads(json.dumps(to_json(conv)))


def test_json_round_trip_equals_the_original() -> None:
    conv = build_conversation()
    data = exported(conv)
    imported = from_json(data)
    assert imported.id != conv.id and len(imported.id) == 32
    assert_same(conv, imported, same_id=False, token_ids=False)
    again = exported(imported)
    for d in (data, again):
        d.pop("exported_at")
        d["conversation"].pop("id")
    assert again == data
    # Token ids are not exported: the import renders its next turn afresh.
    assert imported.kept_ids == [] and all(m.token_ids == [] for m in imported.messages)
    # "Think before answering" travels; a file from before it did imports with it on; a wrong one is named.
    conv.thinking = False
    assert from_json(exported(conv)).thinking is False
    older = exported(conv)
    del older["conversation"]["thinking"]
    assert from_json(older).thinking is True
    older["conversation"]["thinking"] = "no"
    with pytest.raises(ChatImportError, match="thinking"):
        from_json(older)


def test_json_fields() -> None:
    data = exported(build_conversation())
    assert (data["format"], data["version"]) == ("tandem-chat", 1)
    conv = data["conversation"]
    assert set(conv) == {
        "id", "title", "created_at", "system_prompt", "model_id", "context_policy", "thinking", "params", "messages"
    }
    defaults = SamplingParams()  # the fixture sets only these two
    assert conv["params"] == {"max_tokens": 32, "temperature": 0.0, "top_k": defaults.top_k, "top_p": defaults.top_p,
                              "min_p": defaults.min_p, "repetition_penalty": 1.0, "seed": None, "stop": [],
                              "ignore_eos": False}
    reply = conv["messages"][1]
    assert reply["params"]["stop"] == ["\n\nUser:", "###"] and reply["params"]["seed"] == 42
    assert set(reply) == {"role", "text", "state", "created_at", "model_id", "params", "stats", "error",
                          "system_prompt"}
    # Each reply carries the system prompt it was written under; other messages have none.
    assert reply["system_prompt"] == "Be brief.\nAnswer in English." and conv["messages"][0]["system_prompt"] is None
    assert reply["stats"] == {
        "generated_tokens": 4, "tokens_per_s": 12.5, "ttft_s": 0.25, "prompt_tokens": 5,
        "cached_prompt_tokens": 0, "finish_reason": "stop", "elapsed_s": 0.5,
    }
    assert reply["model_id"] == "qwen-folder" and conv["messages"][4]["params"]["temperature"] == 0.0
    text = json.dumps(data).lower()
    assert "api_key" not in text and "token_ids" not in text


def test_markdown() -> None:
    conv = build_conversation()
    interrupted = Message(
        "assistant", "Half a sen", state="interrupted", model_id="default", stats=stats(3, 20, 16, None),
        system_prompt=conv.system_prompt,
    )
    conv = Conversation.restore(
        id=conv.id, title=conv.title, created_at=0.0, system_prompt=conv.system_prompt, params=conv.params,
        model_id=conv.model_id, context_policy=conv.context_policy,
        messages=[*conv.messages, Message("user", "Go on"), interrupted], kept_ids=conv.kept_ids,
        turn_marks=[*conv.turn_marks, None, None],
    )
    md = to_markdown(conv)
    assert md.startswith("# Kyoto in autumn — ünïcode 100%_plan\n")
    # "default" is an alias: the file names the bundled model it stands for.
    assert "- Model: SmolLM2-135M-Instruct" in md and "- Started: 1970-01-01 00:00 UTC" in md
    assert "## System prompt\n\n> Be brief.\n> Answer in English." in md
    assert "### User\n\nPlan a day in Kyoto" in md
    assert (
        "### Assistant (qwen-folder)\n\nTemples and tea.\n\n"
        "*4 tokens · 12.5 tok/s · first token after 0.25 s · 0 of 5 prompt tokens cached*"
    ) in md
    assert "> **Note:** 1 older message was dropped to fit the context." in md
    assert "### Assistant (SmolLM2-135M-Instruct)\n\nGion, for\n\n*2 tokens" in md and "*Stopped before the end.*" in md
    assert "*Failed: The model ran out of memory.*" in md
    assert (
        "Half a sen\n\n*3 tokens · 12.5 tok/s · first token after 0.25 s · 16 of 20 prompt tokens cached*\n"
        "*Interrupted: Tandem closed while this reply was being written"
    ) in md
    order = [
        md.index(s)
        for s in ("Plan a day", "Temples and tea", "older message", "And in the evening", "Gion", "Thanks!")
    ]
    assert order == sorted(order)


def test_markdown_names_models_as_the_window_does() -> None:
    conv = build_conversation()
    names = {"default": "SmolLM2 (bundled)", "qwen-folder": "Qwen2.5 0.5B"}
    md = to_markdown(conv, lambda model_id: names.get(model_id, model_id))
    assert "- Model: SmolLM2 (bundled)" in md
    assert "### Assistant (Qwen2.5 0.5B)" in md and "(qwen-folder)" not in md
    assert "(default)" not in md and "Model: default" not in md


def test_markdown_says_where_a_system_prompt_set_midway_took_effect() -> None:
    conv = Conversation()
    for question, answer, system in (("Hi", "Hello!", ""), ("Again", "Hey.", ""), ("And now?", "Yes.", "Be brief.")):
        conv.system_prompt = system
        conv.append_user(question)
        conv.begin_reply([1, 2])
        conv.add_reply_delta(answer, [3])
        conv.end_reply("complete")
    md = to_markdown(conv)
    # Not a header over the whole chat: it names the prompt for new replies and marks each reply that changed it.
    assert "## System prompt\n" not in md
    assert "## System prompt of new replies\n\n> Be brief." in md
    assert md.count("*No system prompt*") == 1 and md.count("*System prompt: “Be brief.”*") == 1
    assert md.index("Hello!") < md.index("*No system prompt*") < md.index("Hey.") < md.index("Yes.") < md.index(
        "*System prompt: “Be brief.”*")
    # A chat whose replies all had the prompt it has now keeps the one header.
    steady = Conversation(system_prompt="Be brief.")
    steady.append_user("Hi")
    steady.begin_reply([1])
    steady.end_reply("complete")
    assert "## System prompt\n\n> Be brief." in to_markdown(steady) and "System prompt:" not in to_markdown(steady)


def test_markdown_of_an_untitled_conversation() -> None:
    conv = Conversation()
    assert to_markdown(conv).startswith("# Untitled conversation\n")
    conv.append_user("What is   the capital\nof France?")
    assert to_markdown(conv).startswith("# What is the capital\n")


def _mutations() -> list[tuple[str, Any, str]]:
    def set_(path: list[Any], value: Any) -> Any:
        def apply(data: dict[str, Any]) -> Any:
            target = data
            for key in path[:-1]:
                target = target[key]
            if value is _DELETE:
                del target[path[-1]]
            else:
                target[path[-1]] = value
            return data
        return apply

    c, m = ["conversation"], ["conversation", "messages"]
    return [
        ("list", lambda d: [d], "The file must be a JSON object"),
        ("format", set_(["format"], "other"), "not a Tandem chat export"),
        ("newer", set_(["version"], 2), "newer version of Tandem"),
        ("version", set_(["version"], "1"), "no valid \"version\""),
        ("no conversation", set_(c, _DELETE), "\"conversation\" must be a JSON object"),
        ("title", set_(c + ["title"], None), "\"title\" must be text"),
        ("created", set_(c + ["created_at"], "yesterday"), "\"created_at\" must be a time"),
        ("model", set_(c + ["model_id"], ""), "\"model_id\" is empty"),
        ("policy", set_(c + ["context_policy"], "truncate"), "\"context_policy\" must be one of"),
        ("params", set_(c + ["params", "temperature"], -1), "sampling parameters are not valid: temperature"),
        ("params type", set_(c + ["params"], [1]), "\"params\" must be an object"),
        ("messages", set_(m, {}), "\"messages\" must be a list"),
        ("message", set_(m + [0], "hi"), "Message 1 must be a JSON object"),
        ("role", set_(m + [1, "role"], "robot"), "Message 2: \"role\" must be one of"),
        ("state", set_(m + [1, "state"], "done"), "Message 2: \"state\" must be one of"),
        ("text", set_(m + [3, "text"], 5), "Message 4: \"text\" must be text"),
        ("message params", set_(m + [1, "params", "top_p"], 0),
         "Message 2: the sampling parameters are not valid: top_p"),
        ("stats", set_(m + [1, "stats", "generated_tokens"], -3), "Message 2: stats \"generated_tokens\""),
        ("stats rate", set_(m + [1, "stats", "tokens_per_s"], "fast"), "Message 2: stats \"tokens_per_s\""),
        ("stats missing", set_(m + [1, "stats", "elapsed_s"], _DELETE), "Message 2: stats \"elapsed_s\""),
        ("model id", set_(m + [1, "model_id"], 3), "Message 2: \"model_id\" must be text or null"),
        ("system prompt", set_(m + [1, "system_prompt"], ["Be brief."]),
         "Message 2: \"system_prompt\" must be text or null"),
    ]


_DELETE = object()


@pytest.mark.parametrize(("name", "mutate", "message"), _mutations(), ids=[x[0] for x in _mutations()])
def test_import_refuses_what_is_wrong(name: str, mutate: Any, message: str) -> None:
    data = mutate(copy.deepcopy(exported(build_conversation())))
    with pytest.raises(ChatImportError) as info:
        from_json(data)
    assert message in str(info.value)
    assert isinstance(info.value, AppError)


def test_import_ignores_unknown_fields_and_restores_streaming_as_interrupted() -> None:
    data = exported(build_conversation())
    data["comment"] = "from a newer minor release"
    data["conversation"]["messages"][1]["rating"] = 5
    data["conversation"]["messages"][1]["state"] = "streaming"
    imported = from_json(data)
    assert imported.messages[1].state == "interrupted"


def test_import_keeps_each_replys_system_prompt() -> None:
    conv = Conversation()
    for question, system in (("Hi", ""), ("And now?", "Be brief.")):
        conv.system_prompt = system
        conv.append_user(question)
        conv.begin_reply([1])
        conv.end_reply("complete", text="Yes.", token_ids=[2])
    imported = from_json(exported(conv))
    assert [m.system_prompt for m in imported.messages] == [None, "", None, "Be brief."]
    assert to_markdown(imported) == to_markdown(conv)
    # A file from a Tandem that did not export it: the replies' prompts are not known, and the file does not say
    # they were the conversation's.
    older = exported(conv)
    for message in older["conversation"]["messages"]:
        del message["system_prompt"]
    imported = from_json(older)
    assert [m.system_prompt for m in imported.messages] == [None] * 4
    md = to_markdown(imported)
    assert "## System prompt\n\n> Be brief." in md and "System prompt:" not in md


def _pane(prompts_and_replies: list[tuple[str, str]], model: str) -> Conversation:
    conv = Conversation(model_id=model, title=model, params=SamplingParams(temperature=0.7, top_p=1.0, top_k=0, min_p=0.0))
    for prompt, reply in prompts_and_replies:
        conv.append_user(prompt)
        conv.begin_reply(conv.kept_ids + [1])
        conv.end_reply("complete", text=reply, token_ids=[2], stats=stats(1, 3, 0))
    return conv


def test_comparison_aligns_the_same_prompts() -> None:
    a = _pane([("Hi", "Hello from A"), ("Name a colour", "Blue")], "model-a")
    b = _pane([("Hi", "Hey, B here"), ("Name a colour", "Red")], "model-b")
    c = _pane([("Something else", "C's answer")], "model-c")
    md = comparison_markdown([("Left", a), ("Middle", b), ("Right", c)])
    assert md.startswith("# Comparison\n")
    assert "| Left | model-a | temperature 0.7, max tokens 512 | (none) |" in md
    first, second = md.split("## Prompt 1\n")[1].split("## Prompt 2\n")
    # Prompt 1 differs in the third pane: each pane shows its own prompt.
    assert first.index("### Left") < first.index("> Hi") < first.index("Hello from A") < first.index("### Middle")
    marks = ["### Middle", "Hey, B here", "### Right", "> Something else", "C's answer"]
    assert [first.index(x) for x in marks] == sorted(first.index(x) for x in marks)
    # Prompt 2 is the same where it exists: shown once, before the replies.
    assert second.startswith("\n> Name a colour\n") and second.count("Name a colour") == 1
    assert second.index("Blue") < second.index("Red") < second.index("*(no message in this pane)*")
    assert "#### Assistant (model-a)" in first and "*1 token ·" in first
