"""Light and dark palettes: applied to the whole app, text readable on both."""

from __future__ import annotations

from typing import Any

from PySide6.QtGui import QPalette

from ui.theme import apply_theme, diff_highlight_color, is_dark


def _contrast(a: Any, b: Any) -> float:
    def lum(c: Any) -> float:
        def ch(v: float) -> float:
            v /= 255
            return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4

        return 0.2126 * ch(c.red()) + 0.7152 * ch(c.green()) + 0.0722 * ch(c.blue())

    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_forced_palettes_are_dark_and_light_and_readable(qapp: Any) -> None:
    try:
        for theme, dark in (("dark", True), ("light", False)):
            apply_theme(qapp, theme)
            palette = qapp.palette()
            assert is_dark(palette) is dark
            text, base = palette.color(QPalette.ColorRole.Text), palette.color(QPalette.ColorRole.Base)
            assert _contrast(text, base) >= 7  # WCAG AAA for body text
            # Changed words stay readable on their highlight.
            assert _contrast(text, diff_highlight_color(palette)) >= 4.5
            muted = palette.color(QPalette.ColorRole.PlaceholderText)
            assert _contrast(muted, base) >= 3
    finally:
        apply_theme(qapp, "light")


def test_system_theme_restores_the_platform_palette(qapp: Any) -> None:
    try:
        apply_theme(qapp, "system")
        system = qapp.palette().color(QPalette.ColorRole.Window)
        apply_theme(qapp, "dark")
        assert qapp.palette().color(QPalette.ColorRole.Window) != system
        apply_theme(qapp, "system")
        assert qapp.palette().color(QPalette.ColorRole.Window) == system
    finally:
        apply_theme(qapp, "light")
