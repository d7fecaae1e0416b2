"""Killed mid-reply, four times in a row: nothing saved is lost.

Each round runs the real app in a child process (tests/ui/crash_child.py
plays the user), streams a long reply, and kills the process with SIGKILL
as soon as the chat store holds a checkpoint of that reply. The next round
is the fresh start that must show everything: every earlier message intact,
each killed reply "interrupted" with at least its checkpoint's text, and the
crash reported (no model loaded until the user loads one). After each kill
SQLite's own integrity check passes.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.store.chat_store import ChatStore

CHILD = Path(__file__).with_name("crash_child.py")
ROUNDS = 4

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")


def _run_until_checkpoint(env: dict[str, str], model: Path, message: str) -> tuple[dict, dict]:
    child = subprocess.Popen(
        [sys.executable, str(CHILD), "--model", str(model), "--threads", "1", "--message", message],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    reports: dict[str, dict] = {}
    deadline = time.monotonic() + 120
    try:
        assert child.stdout is not None
        for line in child.stdout:
            kind, _, payload = line.partition(" ")
            if kind in ("RESTORED", "CHECKPOINT"):
                reports[kind] = json.loads(payload)
            if kind == "CHECKPOINT" or time.monotonic() > deadline:
                break
    finally:
        child.send_signal(signal.SIGKILL)  # mid-stream: the reply is still being written
        child.wait(30)
        stderr = child.stderr.read() if child.stderr is not None else ""
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
    assert child.returncode == -signal.SIGKILL, stderr[-3000:]
    assert "CHECKPOINT" in reports, f"no checkpoint before the deadline:\n{stderr[-3000:]}"
    return reports["RESTORED"], reports["CHECKPOINT"]


def test_repeated_kills_mid_reply_lose_nothing_saved(tiny_model_dir: Path, tmp_path: Path) -> None:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", TANDEM_DATA_DIR=str(tmp_path / "data"),
               TANDEM_CONFIG_DIR=str(tmp_path / "config"))
    store_path = tmp_path / "data" / "chats.sqlite3"
    # (conversation, position) -> (role, text) of every message a round left complete,
    # and the killed replies with their checkpoint's text.
    kept: dict[tuple[str, int], tuple[str, str]] = {}
    killed: dict[tuple[str, int], str] = {}

    for round_ in range(ROUNDS):
        restored, checkpoint = _run_until_checkpoint(env, tiny_model_dir, f"Round {round_}: tell me a long story.")

        # The fresh start: it says it crashed (except the very first), loads
        # nothing by itself, and shows every earlier message and killed reply.
        assert restored["crash_recovery"] == (round_ > 0)
        if round_ > 0:
            assert "did not close properly" in restored["banner"]
        shown = {(p["conversation"], i): m for p in restored["panes"] for i, m in enumerate(p["messages"])}
        for key, (role, text) in kept.items():
            assert shown[key][0] == role and shown[key][2] == text and shown[key][1] == "complete"
        for key, text in killed.items():
            role, state, shown_text = shown[key]
            assert role == "assistant" and state == "interrupted" and shown_text.startswith(text)

        # The store after the kill: intact, and the reply interrupted with its checkpoint.
        conn = sqlite3.connect(store_path)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        finally:
            conn.close()
        conversation, position = checkpoint["conversation"], checkpoint["position"]
        with ChatStore.open(store_path, recover=False) as store:
            messages = store.load_conversation(conversation).messages
        assert messages[position].state == "interrupted"
        assert messages[position].text.startswith(checkpoint["text"]) and checkpoint["text"]
        assert messages[position - 1].role == "user" and messages[position - 1].text.startswith(f"Round {round_}:")
        kept[conversation, position - 1] = ("user", messages[position - 1].text)
        killed[conversation, position] = checkpoint["text"]
