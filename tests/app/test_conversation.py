"""Conversation bookkeeping against the default model's real tokenizer and
chat template: the kept ids only ever grow by what the template appends, and
cutting the conversation back cuts them at a turn boundary."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.workspace.conversation import Conversation

from app.workspace.messages import ReplyStats
from app.errors import MessageIndexError
from engine.model.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_folder(default_model_dir)


def reply(tokenizer: Tokenizer, text: str) -> list[int]:
    """What the model generates for `text`: its ids and the end-of-turn token."""
    return tokenizer.encode(text) + tokenizer.encode("<|im_end|>")


def play_turn(conversation: Conversation, tokenizer: Tokenizer, user: str, answer: str) -> list[int]:
    prompt = conversation.next_prompt(tokenizer, user_text=user)
    conversation.append_user(user)
    conversation.begin_reply(prompt)
    ids = reply(tokenizer, answer)
    conversation.add_reply_delta(answer, ids)
    conversation.end_reply("complete", text=answer, token_ids=ids)
    return prompt


def test_kept_ids_grow_by_appending_only(tokenizer: Tokenizer) -> None:
    conversation = Conversation(system_prompt="Be brief.")
    first = play_turn(conversation, tokenizer, "Hi", "Hello! How can I help?")
    assert first == tokenizer.encode_chat(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    kept = conversation.kept_ids
    assert kept == first + reply(tokenizer, "Hello! How can I help?")
    assert conversation.context_used == len(kept)

    second = play_turn(conversation, tokenizer, "Name a colour.", "Blue.")
    assert second[: len(kept)] == kept
    # What was appended is exactly the template's text for the new turn.
    assert tokenizer.decode(second[len(kept) :], skip_special_tokens=False) == (
        "\n<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert conversation.kept_ids == second + reply(tokenizer, "Blue.")
    assert [m.role for m in conversation.messages] == ["user", "assistant"] * 2


def test_reply_ids_are_never_retokenized(tokenizer: Tokenizer) -> None:
    conversation = Conversation()
    prompt = conversation.next_prompt(tokenizer, user_text="Hi")
    conversation.append_user("Hi")
    conversation.begin_reply(prompt)
    # "Hello" spelled with single-character tokens: the same text, other ids
    # than encoding it would give.
    odd_ids = [tokenizer.encode(ch)[0] for ch in "Hello"] + tokenizer.encode("<|im_end|>")
    assert odd_ids[:-1] != tokenizer.encode("Hello")
    conversation.end_reply("complete", text="Hello", token_ids=odd_ids)
    following = conversation.next_prompt(tokenizer, user_text="Again")
    assert following[: len(prompt) + len(odd_ids)] == prompt + odd_ids


def test_truncate_and_fork_cut_at_turn_boundaries(tokenizer: Tokenizer) -> None:
    conversation = Conversation()
    play_turn(conversation, tokenizer, "One", "First answer.")
    after_first = conversation.kept_ids
    play_turn(conversation, tokenizer, "Two", "Second answer.")
    after_second = conversation.kept_ids

    assert conversation.kept_ids_for(4) == after_second
    assert conversation.kept_ids_for(3) == after_first  # a trailing user message is not in the kept ids
    assert conversation.kept_ids_for(2) == after_first
    assert conversation.kept_ids_for(1) == []

    fork = conversation.fork(1)
    assert [m.text for m in fork.messages] == ["One", "First answer."]
    assert fork.kept_ids == after_first
    # The fork's next prompt extends the source's first turn, so it hits its pages.
    assert fork.next_prompt(tokenizer, user_text="Other")[: len(after_first)] == after_first
    # The copy is deep: changing the fork leaves the source alone.
    fork.messages[0].text = "changed"
    assert conversation.messages[0].text == "One"

    fork_at_user = conversation.fork(2)
    assert fork_at_user.kept_ids == after_first
    # Regenerating there asks for the same prompt the source's second turn had.
    assert fork_at_user.next_prompt(tokenizer) == after_second[: -len(reply(tokenizer, "Second answer."))]

    conversation.truncate(1)
    assert [m.text for m in conversation.messages] == ["One"]
    assert conversation.kept_ids == []
    with pytest.raises(MessageIndexError):
        conversation.fork(5)


def test_failed_reply_leaves_kept_ids_and_is_not_fed(tokenizer: Tokenizer) -> None:
    conversation = Conversation()
    play_turn(conversation, tokenizer, "One", "Answer.")
    kept = conversation.kept_ids
    prompt = conversation.next_prompt(tokenizer, user_text="Two")
    conversation.append_user("Two")
    conversation.begin_reply(prompt)
    conversation.end_reply("error", error="device lost")
    assert conversation.kept_ids == kept
    assert conversation.messages[-1].state == "error"
    assert {"role": "assistant", "content": ""} not in conversation.chat_messages()
    # Regenerating answers "Two" again with the same prompt.
    assert conversation.next_prompt(tokenizer, upto=3) == prompt


def test_stopped_reply_is_kept_as_far_as_it_got(tokenizer: Tokenizer) -> None:
    conversation = Conversation()
    prompt = conversation.next_prompt(tokenizer, user_text="Count")
    conversation.append_user("Count")
    conversation.begin_reply(prompt)
    partial = tokenizer.encode("1, 2, 3")
    conversation.add_reply_delta("1, 2, 3", partial)
    assert conversation.context_used == len(prompt) + len(partial)
    conversation.end_reply("stopped", stats=ReplyStats(3, 10.0, 0.1, len(prompt), 0, "abort", 0.3))
    assert conversation.messages[-1].state == "stopped"
    assert conversation.messages[-1].text == "1, 2, 3"
    assert conversation.kept_ids == prompt + partial
    # The next turn closes the cut-off reply the way the template does and continues after it.
    following = conversation.next_prompt(tokenizer, user_text="More")
    assert following[: len(prompt) + len(partial)] == prompt + partial


def test_system_prompt_change_renders_afresh(tokenizer: Tokenizer) -> None:
    conversation = Conversation(system_prompt="Old rules.")
    play_turn(conversation, tokenizer, "One", "Answer.")
    conversation.system_prompt = "New rules."
    prompt = conversation.next_prompt(tokenizer, user_text="Two")
    assert prompt == tokenizer.encode_chat(conversation.chat_messages(user_text="Two"))
    conversation.append_user("Two")
    conversation.begin_reply(prompt)
    ids = reply(tokenizer, "Ok.")
    conversation.end_reply("complete", text="Ok.", token_ids=ids)
    # The first turn's boundary no longer indexes into the new ids, so cutting
    # back to it gives nothing rather than ids rendered with the old rules.
    assert conversation.kept_ids_for(2) == []
    assert conversation.kept_ids == prompt + ids


def test_no_user_message_to_answer(tokenizer: Tokenizer) -> None:
    conversation = Conversation()
    with pytest.raises(MessageIndexError):
        conversation.next_prompt(tokenizer)
    play_turn(conversation, tokenizer, "One", "Answer.")
    with pytest.raises(MessageIndexError):
        conversation.next_prompt(tokenizer)


# -- reply versions ------------------------------------------------------------------


def regenerate_turn(conversation: Conversation, tokenizer: Tokenizer, answer: str) -> list[int]:
    """What Workspace.regenerate does: the last reply set aside, a new one written."""
    index = len(conversation.messages) - 1
    prompt = conversation.next_prompt(tokenizer, upto=index)
    conversation.set_version_aside(index)
    conversation.begin_reply(prompt)
    ids = reply(tokenizer, answer)
    conversation.end_reply("complete", text=answer, token_ids=ids)
    return prompt


def test_regenerate_keeps_versions_and_switching_switches_the_kept_ids(tokenizer: Tokenizer) -> None:
    conversation = Conversation()
    play_turn(conversation, tokenizer, "Hi", "Hello.")
    first_kept = conversation.kept_ids
    regenerate_turn(conversation, tokenizer, "Hey there.")
    regenerate_turn(conversation, tokenizer, "Good day.")
    assert [m.text for m in conversation.messages] == ["Hi", "Good day."]
    versions = conversation.messages[1].versions
    assert versions is not None and (versions.current, versions.count) == (2, 3)
    third_kept = conversation.kept_ids

    conversation.show_version(1, 0)
    assert [m.text for m in conversation.messages] == ["Hi", "Hello."]
    assert conversation.kept_ids == first_kept  # the ids this version was generated with
    assert conversation.messages[1].versions is versions and versions.current == 0
    # The next turn continues from the version shown, extending its ids.
    prompt = play_turn(conversation, tokenizer, "Name a colour.", "Blue.")
    assert prompt[: len(first_kept)] == first_kept

    # Back to version 3: its own ids, and the turn played on version 1 went with version 1.
    conversation.show_version(1, 2)
    assert [m.text for m in conversation.messages] == ["Hi", "Good day."]
    assert conversation.kept_ids == third_kept
    conversation.show_version(1, 0)
    assert [m.text for m in conversation.messages] == ["Hi", "Hello.", "Name a colour.", "Blue."]
    assert conversation.kept_ids_for(4)[: len(first_kept)] == first_kept

    with pytest.raises(MessageIndexError, match="no version 4"):
        conversation.show_version(1, 3)
    with pytest.raises(MessageIndexError, match="no other versions"):
        conversation.show_version(3, 0)


def test_edit_keeps_the_old_text_with_its_reply(tokenizer: Tokenizer) -> None:
    conversation = Conversation()
    play_turn(conversation, tokenizer, "Hi", "Hello.")
    play_turn(conversation, tokenizer, "Name a colour.", "Blue.")
    old_kept = conversation.kept_ids
    prompt = conversation.next_prompt(tokenizer, user_text="Name a fruit.", upto=2)
    conversation.edit_user(2, "Name a fruit.")
    assert [m.text for m in conversation.messages] == ["Hi", "Hello.", "Name a fruit."]
    conversation.begin_reply(prompt)
    conversation.end_reply("complete", text="Apple.", token_ids=reply(tokenizer, "Apple."))
    assert conversation.messages[3].versions is not None
    assert conversation.messages[3].versions.count == 2

    conversation.show_version(3, 0)
    assert [m.text for m in conversation.messages] == ["Hi", "Hello.", "Name a colour.", "Blue."]
    assert conversation.kept_ids == old_kept
    conversation.show_version(3, 1)
    assert [m.text for m in conversation.messages] == ["Hi", "Hello.", "Name a fruit.", "Apple."]


def test_a_switch_is_refused_while_a_reply_streams(tokenizer: Tokenizer) -> None:
    conversation = Conversation()
    play_turn(conversation, tokenizer, "Hi", "Hello.")
    regenerate_turn(conversation, tokenizer, "Hey.")
    conversation.begin_reply(conversation.next_prompt(tokenizer, user_text="More?"))
    with pytest.raises(RuntimeError, match="still being written"):
        conversation.show_version(1, 0)
