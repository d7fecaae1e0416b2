"""The frozen program's entry point (PyInstaller runs this file as __main__).

Kept apart from ui/main.py so that the bundle starts exactly as the
`tandem` console script does: `ui.main.run()`. Run as
`tandem --extract-document ...` it is instead the child process that reads a
PDF or Word document (engine/documents/isolated.py): a frozen program has no
`python -m` to start that child with.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["--extract-document"]:  # engine.documents.isolated.FROZEN_CHILD_FLAG
        from engine.documents.isolated import child_main

        sys.exit(child_main(sys.argv[2:]))
    from ui.main import run

    run()
