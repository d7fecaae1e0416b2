"""PDF and Word extraction in a child process, bounded in address space and time, killed
on cancel. pypdf and mammoth are pure Python over untrusted structure: a damaged or hostile
file can make them loop for minutes or allocate gigabytes, and no thread can be stopped
from outside. A child can, and its death leaves the app (or the server) as it was.

The child reads the file's bytes on stdin and writes one JSON object on stdout: the text,
or the one line that says why there is none. Starting it costs a Python start and the
reader's import (docs/benchmarks.md, "Documents"), small beside reading any real PDF.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from engine.errors import DocumentCancelled, DocumentError

# The child's address space (RLIMIT_AS): Python and pypdf take ~100 MB; a 64 MB PDF of
# scanned pages may take a few hundred more while pypdf reads it.
CHILD_ADDRESS_SPACE_BYTES = 2 << 30
# A 5,000-page text PDF reads in about a minute on a slow laptop core.
EXTRACTION_TIMEOUT_S = 120.0
# The argument the frozen program (packaging/tandem_entry.py) runs the child under.
FROZEN_CHILD_FLAG = "--extract-document"
_POLL_S = 0.05
_ISOLATED_KINDS = ("pdf", "docx")


def extract_isolated(kind: str, name: str, data: bytes, max_chars: int,
                     cancel: threading.Event | None = None) -> tuple[str, int | None, bool]:
    """(text, pages, complete) of a `kind` ("pdf" or "docx") file, read in a child process.
    DocumentError with the child's one line, or when it ran out of time or memory;
    DocumentCancelled when `cancel` was set (the child is killed)."""
    if kind not in _ISOLATED_KINDS:
        raise ValueError(f"no isolated reader for {kind!r}")
    command = [*_child_command(), kind, name, str(max_chars)]
    # The bytes reach the child as a file: a pipe would need a writer thread, since
    # communicate() stops feeding stdin after its first timeout.
    with tempfile.TemporaryFile() as source:
        source.write(data)
        source.seek(0)
        proc = subprocess.Popen(command, stdin=source, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=_child_environment())
    deadline = time.monotonic() + EXTRACTION_TIMEOUT_S
    try:
        while True:
            try:
                out, err = proc.communicate(timeout=_POLL_S)
                break
            except subprocess.TimeoutExpired:
                if cancel is not None and cancel.is_set():
                    raise DocumentCancelled(f"Reading {name} was cancelled.") from None
                if time.monotonic() > deadline:
                    raise DocumentError(f"{name} took more than {EXTRACTION_TIMEOUT_S:.0f} s to read and was "
                                        "given up; it may be damaged.") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return _result(name, proc.returncode, out, err)


def _result(name: str, returncode: int, out: bytes, err: bytes) -> tuple[str, int | None, bool]:
    try:
        answer = json.loads(out)
    except ValueError:
        answer = None
    if isinstance(answer, dict) and isinstance(answer.get("error"), str):
        raise DocumentError(answer["error"])
    if returncode == 0 and isinstance(answer, dict) and isinstance(answer.get("text"), str):
        return answer["text"], answer.get("pages"), bool(answer.get("complete", True))
    if b"MemoryError" in err:
        raise DocumentError(f"{name} needs more than {CHILD_ADDRESS_SPACE_BYTES >> 30} GiB of memory to read; "
                            "it may be damaged.")
    last = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit status {returncode}"]
    raise DocumentError(f"{name} could not be read (the reader stopped: {last[0][:160]}).")


def _child_command() -> list[str]:
    if getattr(sys, "frozen", False):
        return [sys.executable, FROZEN_CHILD_FLAG]
    return [sys.executable, "-m", __name__]


def _child_environment() -> dict[str, str]:
    # The child imports this package from where the parent did, installed or a checkout.
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def child_main(argv: list[str]) -> int:
    """The child: `kind name max_chars` as arguments, the file's bytes on stdin."""
    _limit_address_space()
    kind, name, max_chars = argv[0], argv[1], int(argv[2])
    data = sys.stdin.buffer.read()
    try:
        if kind == "pdf":
            from engine.documents.pdf import pdf_text

            text, pages, complete = pdf_text(name, data, max_chars)
        else:
            from engine.documents.docx import docx_text

            text, complete = docx_text(name, data, max_chars)
            pages = None
        answer = {"text": text, "pages": pages, "complete": complete}
    except DocumentError as exc:
        answer = {"error": str(exc)}
    except MemoryError:
        del data
        answer = {"error": f"{name} needs more than {CHILD_ADDRESS_SPACE_BYTES >> 30} GiB of memory to read; "
                           "it may be damaged."}
    except RecursionError:
        answer = {"error": f"{name} is nested too deeply to read; it may be damaged."}
    sys.stdout.write(json.dumps(answer))
    sys.stdout.flush()
    return 0


def _limit_address_space() -> None:
    try:
        import resource
    except ImportError:  # Windows: the timeout still holds
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = CHILD_ADDRESS_SPACE_BYTES
    if soft != resource.RLIM_INFINITY:
        limit = min(limit, soft)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
