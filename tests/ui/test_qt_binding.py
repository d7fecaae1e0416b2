"""The Qt binding itself: a release that miscounts references crashes the window."""

from __future__ import annotations

import sys

from PySide6.QtWidgets import QLabel


def test_qt_calls_that_return_nothing_keep_none_alive(qapp) -> None:
    # PySide6 6.12.0 on Python 3.11 dropped one reference to None per such
    # call; None's count reached zero mid-stream ("Fatal Python error:
    # none_dealloc"). Python 3.12+ makes None immortal, so the count there
    # does not move either way.
    label = QLabel()
    before = sys.getrefcount(None)
    for _ in range(1000):
        label.setText("x")
    assert sys.getrefcount(None) >= before - 10
