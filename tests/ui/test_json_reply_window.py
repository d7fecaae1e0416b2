"""'Reply as JSON' in the real window: a saved schema set on three panes
through their settings popovers, one broadcast on the default model, each
reply shown indented with its mark (the pane whose max tokens cut it off
marked invalid); a malformed or unsupported schema said in the form with
the pane's settings kept; saved schemas across a restart, a corrupt file
that does not stop the window; a sweep that keeps the constraint; a remote
pane that sends it as response_format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import shiboken6

from app.workspace.json_reply import check_reply
from tests.ui.conftest import on_loop, wait_until
from tests.ui.test_remote_pane_ui import KEY, server  # noqa: F401 - the fixture: Tandem's server on loopback
from tests.ui.test_window import replies_done, send
from tests.ui.test_window_chats import _close, _make, _send

ANSWER_SCHEMA = '{"type": "object", "properties": {"answer": {"type": "integer"}}, ' \
                '"required": ["answer"], "additionalProperties": false}'


def _closed(popover: Any) -> bool:
    """Closed and deleted (WA_DeleteOnClose): the next popover opens on its own."""
    return not shiboken6.isValid(popover)


async def _set_json(window: Any, pane_id: int, *, saved: str | None = None, spec: str | None = None,
                    max_tokens: int | None = None) -> Any:
    """Open the pane's settings, choose "JSON schema" (a saved one or `spec` pasted), apply; the popover."""
    window.panes[pane_id].settings_button.click()
    popover = window.popover
    form = popover.json_form
    form.mode.setCurrentIndex(form.mode.findData("json_schema"))
    if saved is not None:
        index = form.saved_box.findText(saved)
        form.saved_box.setCurrentIndex(index)
        form.saved_box.activated.emit(index)
    if spec is not None:
        form.schema_edit.setPlainText(spec)
    if max_tokens is not None:
        popover.max_tokens.setValue(max_tokens)
    popover.apply_button.click()
    return popover


@on_loop()
async def test_three_panes_reply_to_one_saved_schema_with_their_marks(
    loop: Any, default_model_dir: Path, tmp_path: Path, qapp: Any
) -> None:
    from PySide6.QtGui import QGuiApplication

    from app.workspace.turn_summary import figures_of, last_turn, to_csv

    window = _make(tmp_path, default_model_dir, panes=3)
    try:
        window.load_engine()
        await wait_until(lambda: window.workspace.engine_state == "ready", what="the default model")
        panes = window.workspace.panes
        window.panes[panes[0].id].settings_button.click()
        form = window.popover.json_form
        form.mode.setCurrentIndex(form.mode.findData("json_schema"))
        form.schema_edit.setPlainText(ANSWER_SCHEMA)
        form.save_name.setText("sum")
        form.save_button.click()
        assert window.saved_schemas.names() == ["sum"] and "Saved as" in form.message.text()
        first = window.popover
        first.close()
        await wait_until(lambda: _closed(first), what="the popover to go")
        for pane, tokens in zip(panes, (24, 24, 3)):  # the third is cut off before its JSON ends
            popover = await _set_json(window, pane.id, saved="sum", max_tokens=tokens)
            await wait_until(lambda: _closed(popover), what="the schema check and apply")
            assert pane.conversation.params.constraint is not None
            assert pane.conversation.params.constraint.spec == ANSWER_SCHEMA
            assert "JSON: sum" in window.panes[pane.id].summary_label.full_text()
        await _send(window, "What is 2 + 3? Reply with JSON.")
        window.flush_panes()

        def last_view(pane: Any) -> Any:
            return window.panes[pane.id].messages[len(pane.conversation.messages) - 1]

        await wait_until(lambda: all(last_view(p).json_verdict is not None for p in panes), what="the marks")
        marks = []
        for pane in panes:
            reply = pane.conversation.messages[-1]
            view = window.panes[pane.id].messages[len(pane.conversation.messages) - 1]
            assert reply.text == reply.answer  # the stored reply is the model's own text
            marks.append(view.json_mark.text())
            assert view.json_mark.isVisibleTo(view)
            code = view.body.code_blocks()
            assert len(code) == 1
            if view.json_verdict.valid:
                assert code[0].text().strip() == json.dumps(json.loads(reply.text), indent=2)
            else:
                assert code[0].text().strip() == reply.text.strip()  # shown as written: it does not parse
            view.copy_text()
            assert QGuiApplication.clipboard().text() == reply.text  # Copy copies the raw reply
        assert marks[:2] == ["✓ matches the schema"] * 2, marks
        assert marks[2] == "✗ invalid: ends before the JSON is complete (it reached the token limit)"
        assert window.compare.json_count_text() == " · JSON valid in 2 of 3"
        message, replies = last_turn(panes)
        figures = figures_of(replies)
        assert [f.json for f in figures] == ["valid", "valid", marks[2][2:]]
        assert "JSON" in to_csv(figures).splitlines()[0]
    finally:
        await _close(window)


@on_loop()
async def test_a_malformed_or_unsupported_schema_is_said_and_the_pane_keeps_its_settings(
    loop: Any, make_window: Any
) -> None:
    window = make_window(panes=1)
    pane = window.workspace.panes[0]
    before = pane.conversation.params
    # Not JSON: said at once, in the form.
    popover = await _set_json(window, pane.id, spec='{"type": "object", "properties": ')
    assert window.popover is popover and popover.json_form.message.isVisible()
    assert popover.json_form.message.text().startswith("The schema is not valid JSON")
    assert pane.conversation.params == before
    # JSON, but not a schema the engine can follow: checked on a worker thread, then said.
    popover.json_form.schema_edit.setPlainText('{"type": "object", "properties": {"a": {"$ref": "#/nope"}}}')
    popover.apply_button.click()
    await wait_until(lambda: popover.apply_button.isEnabled(), what="the schema check")
    assert popover.json_form.message.text() == "The JSON schema cannot be used: Pointer '/nope' does not exist"
    assert window.popover is popover and pane.conversation.params == before
    # A schema it can follow applies, and "Any JSON object" and "Off" too.
    popover.json_form.schema_edit.setPlainText(ANSWER_SCHEMA)
    popover.apply_button.click()
    await wait_until(lambda: _closed(popover), what="the apply")
    assert pane.conversation.params.constraint.spec == ANSWER_SCHEMA
    assert "JSON: schema" in window.panes[pane.id].summary_label.full_text()
    window.panes[pane.id].settings_button.click()
    popover = window.popover
    form = popover.json_form
    assert form.schema_edit.toPlainText() == ANSWER_SCHEMA  # the form shows what the pane has
    form.mode.setCurrentIndex(form.mode.findData("json_object"))
    popover.apply_button.click()
    await wait_until(lambda: _closed(popover), what="the apply")
    assert pane.conversation.params.constraint.kind == "json_object"
    assert "JSON: object" in window.panes[pane.id].summary_label.full_text()
    window.panes[pane.id].settings_button.click()
    popover = window.popover
    popover.json_form.mode.setCurrentIndex(0)
    popover.apply_button.click()
    assert pane.conversation.params.constraint is None and not popover.isVisible()
    assert "JSON" not in window.panes[pane.id].summary_label.full_text()


@on_loop()
async def test_saved_schemas_survive_a_restart_and_a_corrupt_file_does_not_stop_the_window(
    loop: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from app.workspace.saved_schemas import saved_schemas_path

    window = _make(tmp_path, tiny_model_dir, panes=1)
    pane = window.workspace.panes[0]
    window.panes[pane.id].settings_button.click()
    form = window.popover.json_form
    form.mode.setCurrentIndex(form.mode.findData("json_schema"))
    form.schema_edit.setPlainText(ANSWER_SCHEMA)
    form.save_name.setText("sum")
    form.save_button.click()
    window.popover.close()
    await _close(window)

    window = _make(tmp_path, tiny_model_dir, panes=1)
    try:
        assert window.saved_schemas.names() == ["sum"]
        window.panes[window.workspace.panes[0].id].settings_button.click()
        form = window.popover.json_form
        assert [form.saved_box.itemText(i) for i in range(1, form.saved_box.count())] == ["sum"]
        form.mode.setCurrentIndex(form.mode.findData("json_schema"))
        form.saved_box.setCurrentIndex(1)
        form.delete_button.click()
        assert form.saved_box.count() == 1 and not saved_schemas_path().read_text().count("sum")
        window.popover.close()
    finally:
        await _close(window)

    saved_schemas_path().write_bytes(b'{"schemas": [{"name": "cut')
    window = _make(tmp_path, tiny_model_dir, panes=1)
    try:
        assert window.saved_schemas.names() == [] and window.isVisible()
        assert "were not used because" in window.statusBar().currentMessage()
        assert saved_schemas_path().with_name("json-schemas.json.bad").exists()
    finally:
        await _close(window)


@on_loop()
async def test_a_sweep_keeps_the_json_constraint_on_every_new_pane(loop: Any, make_window: Any) -> None:
    from engine.params import SamplingParams
    from engine.structured import Constraint

    window = make_window(panes=1)
    pane = window.workspace.panes[0]
    constraint = Constraint("json_schema", ANSWER_SCHEMA)
    window.workspace.set_params(pane.id, SamplingParams(temperature=0.0, max_tokens=8, constraint=constraint))
    for keep in (True, False):
        window.sweeps.open_for(pane.id)
        dialog = window.sweeps.dialog
        assert dialog.keep_json.isVisibleTo(dialog) and dialog.keep_json.isChecked()
        assert "JSON: schema" in dialog.keep_json.text()
        dialog.parameter.setCurrentIndex(dialog.parameter.findData("temperature"))
        dialog.values_edit.setPlainText("0.2, 0.9")
        dialog.keep_json.setChecked(keep)
        dialog.accept()
        swept = [p for p in window.workspace.panes if p.conversation.params.temperature in (0.2, 0.9)]
        assert len(swept) == 2
        assert [p.conversation.params.constraint for p in swept] == [constraint if keep else None] * 2
        for p in swept:
            window.close_pane_now(p.id)
    # A pane with no constraint: the box is not offered.
    window.workspace.set_params(pane.id, SamplingParams(temperature=0.0))
    window.sweeps.open_for(pane.id)
    assert not window.sweeps.dialog.keep_json.isVisibleTo(window.sweeps.dialog)
    window.sweeps.dialog.reject()


@on_loop()
async def test_a_remote_pane_asks_the_server_for_json_and_its_reply_is_marked(
    loop: Any, make_window: Any, server: Any
) -> None:
    from engine.params import SamplingParams
    from engine.structured import Constraint

    window = make_window(panes=1)
    pane = window.workspace.panes[0]
    await window.workspace.set_remote(pane.id, server.base_url, "tiny", KEY)
    window.workspace.set_params(pane.id, SamplingParams(
        temperature=0.0, max_tokens=6, constraint=Constraint("json_object")))
    send(window, "Reply with a JSON object.")
    await wait_until(lambda: replies_done(window), what="the remote reply")
    window.flush_panes()
    reply = pane.conversation.messages[-1]
    view = window.panes[pane.id].messages[len(pane.conversation.messages) - 1]
    await wait_until(lambda: view.json_verdict is not None, what="the mark")
    # The server held its reply to JSON (response_format): a random model starts with "{" only so.
    assert reply.text.lstrip().startswith("{"), reply.text
    mark = window.panes[pane.id].messages[len(pane.conversation.messages) - 1].json_mark
    verdict = check_reply(reply.text, Constraint("json_object"), reply.stats.finish_reason)
    assert mark.isVisibleTo(mark.parentWidget()) and mark.text() == verdict.mark


@on_loop()
async def test_the_check_runs_off_the_gui_thread_and_the_mark_follows(loop: Any, make_window: Any) -> None:
    """A schema's "pattern" is a Python regular expression, one from a chat file may backtrack for
    minutes: the view shows the reply at once and its mark when the worker thread has it."""
    from app import events as ev
    from engine.params import SamplingParams
    from engine.structured import Constraint

    window = make_window(panes=1)
    pane = window.workspace.panes[0]
    view = window.panes[pane.id]
    code = Constraint("json_schema", '{"type": "object", "properties": {"code": {"type": "string", '
                                     '"pattern": "^(a+)+$"}}, "required": ["code"]}')
    for text, mark in (('{"code": "aaaa"}', "✓ matches the schema"),
                       ('{"code": "aab"}', "✗ invalid: at $.code: 'aab' does not match '^(a+)+$'")):
        conv = pane.conversation
        conv.params = SamplingParams(temperature=0.0, constraint=code)
        window.events(ev.MessageAppended(pane.id, conv.append_user("A code, please.")))
        index = conv.begin_reply([1, 2, 3])
        conv.add_reply_delta(text, [4])
        conv.end_reply("complete")
        window.events(ev.MessageAppended(pane.id, index))
        message = view.messages[index]
        # Shown at once, its mark not yet: the check has not run on this (the GUI) thread.
        assert message.json_verdict is None and not message.json_mark.isVisibleTo(message)
        assert message.body.code_blocks()[0].text().strip() == text
        await wait_until(lambda: message.json_verdict is not None, what="the mark")
        assert message.json_mark.text() == mark and message.json_mark.isVisibleTo(message)


def test_the_turn_summary_shows_a_long_json_verdict_whole_in_its_tooltip(qtbot: Any) -> None:
    from app.workspace.turn_summary import ReplyFigures
    from ui.dialogs.turn_summary import TurnSummaryDialog

    dialog = TurnSummaryDialog()
    qtbot.addWidget(dialog)
    why = "invalid: ends before the JSON is complete (it reached the token limit)"
    dialog.show_figures("Describe the film", [ReplyFigures(1, "Pane 1", "SmolLM2", 4, 10, 40.0, 0.2, {}, json=why)])
    head = [dialog.table.horizontalHeaderItem(c).text() for c in range(dialog.table.columnCount())]
    item = dialog.table.item(0, head.index("JSON"))
    assert item.text() == why and item.toolTip() == why
