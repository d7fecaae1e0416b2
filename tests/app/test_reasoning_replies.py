"""A reasoning model's reply in the app: the raw text kept, its reasoning timed
and counted apart, and left out wherever the answer is meant (the next prompt
where the template does not drop it, compare, Use in all panes, the turn
summary, the Markdown export)."""

from __future__ import annotations

from app.store.export import reply_markdown
from app.workspace.conversation import Conversation
from app.workspace.messages import Message, ReplyStats
from app.workspace.turn_summary import TurnReply, figures_of, header, rows
from tests.engine.test_reasoning import QWEN3, R1_LLAMA, first_turn, template_tokenizer

REASONING = "Two and two make four."
ANSWER = "It is 4."


def stats(generated: int, elapsed: float) -> ReplyStats:
    return ReplyStats(generated, 20.0, 0.5, 10, 0, None, elapsed)


def thinking_conversation(*, opens: bool) -> tuple[Conversation, Message]:
    """A turn whose reply streams its think block, then its answer."""
    conversation = Conversation()
    conversation.append_user("What is 2+2?")
    index = conversation.begin_reply([1, 2, 3], opens_reasoning=opens)
    pieces = [("" if opens else "<think>\n") + "Two and two", " make four.\n</th", "ink>\n\nIt is", " 4."]
    for n, piece in enumerate(pieces, start=1):
        conversation.add_reply_delta(piece, [n], stats(3 * n, 0.5 + n))
        if n == 1:
            reply = conversation.messages[index]
            assert (reply.reasoning_tokens, reply.reasoning_s) == (3, 1.0)  # live while it thinks
    return conversation, conversation.messages[index]


def test_the_reasoning_is_timed_and_counted_up_to_the_delta_that_closes_it() -> None:
    for opens in (False, True):
        conversation, reply = thinking_conversation(opens=opens)
        assert (reply.reasoning_tokens, reply.reasoning_s) == (9, 3.0)  # "</think>" came with the third delta
        conversation.end_reply("complete", text=reply.text.removeprefix("<think>\n") if opens else reply.text,
                               stats=stats(12, 5.0))
        # The raw text is kept, with the opening tag the R1 distills' prompt wrote, so it reads alone once stored.
        assert reply.text.startswith("<think>\n") and reply.text.endswith("</think>\n\nIt is 4.")
        assert (reply.parts.reasoning, reply.answer) == (REASONING, ANSWER)
        assert (reply.reasoning_tokens, reply.reasoning_s) == (9, 3.0)


def test_the_next_prompt_leaves_the_reasoning_out_whoever_drops_it() -> None:
    conversation, reply = thinking_conversation(opens=False)
    conversation.end_reply("complete")
    assert conversation.chat_messages()[1]["content"] == ANSWER
    assert conversation.chat_messages(raw_replies=True)[1]["content"] == reply.text
    # A template that drops the reasoning itself gets the raw reply; ChatML's, which would
    # keep it, gets the answer alone from the app.
    for name in (QWEN3, None):
        tokenizer = template_tokenizer(name)
        prompt = tokenizer.decode(conversation.next_prompt(tokenizer, "And 3+3?"), skip_special_tokens=False)
        assert ANSWER in prompt and "Two and two" not in prompt


def test_think_before_answering_switches_qwen3s_template() -> None:
    tokenizer = template_tokenizer(QWEN3)
    conversation = Conversation()
    thinking = tokenizer.decode(conversation.next_prompt(tokenizer, "Hi"), skip_special_tokens=False)
    conversation.thinking = False
    quick = tokenizer.decode(conversation.next_prompt(tokenizer, "Hi"), skip_special_tokens=False)
    assert quick == thinking + "<think>\n\n</think>\n\n"
    conversation.append_user("Hi")
    assert conversation.fork(0).thinking is False  # a fork thinks as its pane does
    # A template without the switch renders the same either way.
    r1 = template_tokenizer(R1_LLAMA)
    assert conversation.template_kwargs(r1) is None and conversation.template_kwargs(tokenizer) == {
        "enable_thinking": False}
    assert first_turn(r1)[1].startswith("<think>\n")


def test_another_model_takes_the_answer_and_the_summary_counts_reasoning_apart() -> None:
    _, reply = thinking_conversation(opens=False)
    other = Conversation(model_id="other")
    other.append_user("What is 2+2?")
    carried = other.messages[other.adopt_reply(reply, None)]
    assert carried.text == ANSWER
    figures = figures_of([TurnReply(1, "Pane 1", "r1", reply.answer, stats(12, 5.0), reply.reasoning_tokens),
                          TurnReply(2, "Pane 2", "plain", ANSWER, stats(4, 1.0))])
    head = header(figures)
    assert head[3:5] == ["Reasoning tokens", "Answer tokens"]
    assert [row[3:5] for row in rows(figures)] == [["9", "3"], ["", "4"]]
    assert figures[0].shared == {2: 1.0} and figures[0].words == 3  # compared by the answers
    assert header(figures_of([TurnReply(2, "Pane 2", "plain", ANSWER, stats(4, 1.0))]))[3] == "Tokens"


def test_the_markdown_export_folds_the_reasoning_away() -> None:
    _, reply = thinking_conversation(opens=True)
    text = reply_markdown(reply)
    assert text.startswith("<details>\n<summary>Thinking</summary>\n\nTwo and two make four.\n\n</details>")
    assert text.endswith("\n\nIt is 4.")
    assert reply_markdown(Message("assistant", "Plain.")) == "Plain."
