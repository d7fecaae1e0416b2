"""The frozen program's entry point (PyInstaller runs this file as __main__).

Kept apart from ui/main.py so that the bundle starts exactly as the
`tandem` console script does: `ui.main.run()`.
"""

from __future__ import annotations

from ui.main import run

if __name__ == "__main__":
    run()
