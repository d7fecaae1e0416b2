"""`python -m engine`: the command line lives in engine.entrypoints.cli."""

import sys

from engine.entrypoints.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
