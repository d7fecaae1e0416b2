"""Render resources/icons/tandem.svg into the PNG sizes and the Windows .ico.

The PNGs are committed, so neither a build nor the app needs an SVG
renderer; run this again after changing the SVG:
    QT_QPA_PLATFORM=offscreen .venv/bin/python packaging/make_icons.py
"""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

ICONS = Path(__file__).resolve().parent.parent / "resources" / "icons"
SIZES = (16, 24, 32, 48, 64, 128, 256, 512)  # the hicolor theme's usual sizes
ICO_SIZES = (16, 24, 32, 48, 256)  # what Windows asks an .ico for


def render(renderer: QSvgRenderer, size: int) -> QImage:
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter, QRectF(0, 0, size, size))
    painter.end()
    return image


def main() -> int:
    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841 (QImage needs it)
    renderer = QSvgRenderer(str(ICONS / "tandem.svg"))
    if not renderer.isValid():
        print(f"cannot read {ICONS / 'tandem.svg'}", file=sys.stderr)
        return 1
    for size in SIZES:
        path = ICONS / f"tandem-{size}.png"
        if not render(renderer, size).save(str(path), "PNG"):
            print(f"cannot write {path}", file=sys.stderr)
            return 1
    # Qt's ico writer stores one image per file; the largest is what Windows
    # scales down from, and is what PyInstaller embeds in tandem.exe.
    if not render(renderer, 256).save(str(ICONS / "tandem.ico"), "ICO"):
        print("cannot write tandem.ico (Qt's ico image format plugin is missing)", file=sys.stderr)
        return 1
    print(f"wrote {len(SIZES)} PNG sizes and tandem.ico to {ICONS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
