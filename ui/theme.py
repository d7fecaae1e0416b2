"""Light and dark: follow the system, or force one.

"system" leaves the palette to Qt, which follows the desktop's colour scheme
(and tells us when it changes). "light"/"dark" install a fixed Fusion palette,
which is also how tests and screenshots get a known look on any platform.
Widgets take their colours from the palette, never from constants.
"""

from __future__ import annotations

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QGuiApplication, QPainter, QPalette, QPen
from PySide6.QtWidgets import QApplication, QProxyStyle, QStyle, QStyleFactory, QStyleOption, QWidget

THEMES = ("system", "light", "dark")


def _dark_palette() -> QPalette:
    p = QPalette()
    window, base, text = QColor(0x2B, 0x2B, 0x2E), QColor(0x1E, 0x1E, 0x20), QColor(0xE6, 0xE6, 0xE6)
    roles = {
        QPalette.ColorRole.Window: window,
        QPalette.ColorRole.WindowText: text,
        QPalette.ColorRole.Base: base,
        QPalette.ColorRole.AlternateBase: QColor(0x33, 0x33, 0x38),
        QPalette.ColorRole.ToolTipBase: QColor(0x3A, 0x3A, 0x3F),
        QPalette.ColorRole.ToolTipText: text,
        QPalette.ColorRole.PlaceholderText: QColor(0x9A, 0x9A, 0xA0),
        QPalette.ColorRole.Text: text,
        QPalette.ColorRole.Button: QColor(0x3A, 0x3A, 0x3F),
        QPalette.ColorRole.ButtonText: text,
        QPalette.ColorRole.BrightText: QColor(0xFF, 0x6B, 0x6B),
        QPalette.ColorRole.Link: QColor(0x6C, 0xB4, 0xFF),
        QPalette.ColorRole.Highlight: QColor(0x2F, 0x6F, 0xC0),
        QPalette.ColorRole.HighlightedText: QColor(0xFF, 0xFF, 0xFF),
        QPalette.ColorRole.Light: QColor(0x4A, 0x4A, 0x50),
        QPalette.ColorRole.Midlight: QColor(0x40, 0x40, 0x45),
        QPalette.ColorRole.Mid: QColor(0x30, 0x30, 0x34),
        QPalette.ColorRole.Dark: QColor(0x18, 0x18, 0x1A),
        QPalette.ColorRole.Shadow: QColor(0x00, 0x00, 0x00),
    }
    for role, color in roles.items():
        p.setColor(role, color)
    disabled = QColor(0x80, 0x80, 0x85)
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText, QPalette.ColorRole.WindowText):
        p.setColor(QPalette.ColorGroup.Disabled, role, disabled)
    return p


class VisibleIndicatorStyle(QProxyStyle):
    """Fusion, with check boxes and radio buttons outlined so they show on a dark palette.

    Fusion outlines them in the window colour made darker, which on a dark
    window is all but the colour of their own dark fill: on the dark palette
    the box or circle gets a clear outline in the secondary text colour."""

    _INDICATORS = (QStyle.PrimitiveElement.PE_IndicatorCheckBox, QStyle.PrimitiveElement.PE_IndicatorRadioButton)

    def __init__(self) -> None:
        super().__init__(QStyleFactory.create("Fusion"))

    def drawPrimitive(  # noqa: N802 (Qt naming)
        self, element: QStyle.PrimitiveElement, option: QStyleOption, painter: QPainter, widget: QWidget | None = None
    ) -> None:
        super().drawPrimitive(element, option, painter, widget)
        if element not in self._INDICATORS or not is_dark(option.palette):
            return
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        enabled = bool(option.state & QStyle.StateFlag.State_Enabled)
        color = indicator_outline_color(option.palette) if enabled else option.palette.color(QPalette.ColorRole.Mid)
        painter.setPen(QPen(color, 1.2))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        rect = QRectF(option.rect).adjusted(0.6, 0.6, -0.6, -0.6)
        if element == QStyle.PrimitiveElement.PE_IndicatorRadioButton:
            side = min(rect.width(), rect.height())
            circle = QRectF(0, 0, side, side)
            circle.moveCenter(rect.center())
            painter.drawEllipse(circle)
        else:
            painter.drawRoundedRect(rect, 2, 2)
        painter.restore()


def indicator_outline_color(palette: QPalette) -> QColor:
    """The outline of a check box or radio button on `palette`: clearly apart from its fill and the window."""
    return palette.color(QPalette.ColorRole.PlaceholderText)


def apply_theme(app: QApplication, theme: str) -> None:
    """Install `theme` ("system" | "light" | "dark") on the application."""
    if theme not in THEMES:
        theme = "system"
    # Fusion: the same widgets and metrics everywhere; it honours palettes fully.
    if not isinstance(app.style(), VisibleIndicatorStyle) and app.style().name().lower() != "fusion":
        app.setStyle("Fusion")
    if theme == "dark":
        app.setPalette(_dark_palette())
    elif theme == "light":
        app.setPalette(app.style().standardPalette())
    else:
        # A palette with nothing set gives the platform's back (after a forced theme).
        app.setPalette(QPalette())
        scheme = QGuiApplication.styleHints().colorScheme()
        if scheme == Qt.ColorScheme.Dark and not is_dark(app.palette()):
            app.setPalette(_dark_palette())
        elif scheme == Qt.ColorScheme.Light and is_dark(app.palette()):
            app.setPalette(app.style().standardPalette())
    _outline_indicators(app, is_dark(app.palette()))


def _outline_indicators(app: QApplication, dark: bool) -> None:
    """On a dark palette, Fusion with outlined check boxes and radio buttons;
    plain Fusion otherwise (its own indicators show well on light)."""
    if dark == isinstance(app.style(), VisibleIndicatorStyle):
        return
    palette = QPalette(app.palette())
    app.setStyle(VisibleIndicatorStyle() if dark else "Fusion")
    app.setPalette(palette)  # a new style brings its own standard palette: keep the theme's


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.ColorRole.Window).lightness() < 128


def _mix(a: QColor, b: QColor, t: float) -> QColor:
    return QColor(
        round(a.red() * (1 - t) + b.red() * t),
        round(a.green() * (1 - t) + b.green() * t),
        round(a.blue() * (1 - t) + b.blue() * t),
    )


def diff_highlight_color(palette: QPalette) -> QColor:
    """Background for changed words: visible on the palette's base, text still readable."""
    accent = QColor(0xC8, 0x8A, 0x00) if is_dark(palette) else QColor(0xFF, 0xD2, 0x4D)
    return _mix(palette.color(QPalette.ColorRole.Base), accent, 0.55 if is_dark(palette) else 0.8)


def user_bubble_color(palette: QPalette) -> QColor:
    return _mix(palette.color(QPalette.ColorRole.Base), palette.color(QPalette.ColorRole.Highlight), 0.12)


def muted_text_color(palette: QPalette) -> QColor:
    return palette.color(QPalette.ColorRole.PlaceholderText)


def warning_color(palette: QPalette) -> QColor:
    """An amber that reads as "careful" on the palette's base, light or dark."""
    return QColor("#d08a00") if is_dark(palette) else QColor("#b86e00")


def success_color(palette: QPalette) -> QColor:
    """A green for "this is right" (a reply that is valid JSON), readable on the palette's base."""
    return QColor("#66bb6a") if is_dark(palette) else QColor("#1b7a2e")


def error_color(palette: QPalette) -> QColor:
    """A red for "this is wrong" (a reply that is not the JSON asked for), readable on the palette's base."""
    return QColor("#ef6c6c") if is_dark(palette) else QColor("#b3261e")
