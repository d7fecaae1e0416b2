"""A local stand-in for the Hugging Face Hub, for tests without the network.

A threaded http.server on 127.0.0.1 answering the endpoints huggingface_hub
2.x and app/models/download.py call:

- GET /api/models?search=&sort=&limit=&expand=   (HfApi.list_models)
- GET /api/models/{repo}  and  /api/models/{repo}/revision/{rev}?blobs=True
  (HfApi.model_info(files_metadata=True): siblings with sizes and LFS SHA-256)
- GET/HEAD /{repo}/resolve/{rev}/{file}, with Range (206 + Content-Range) and
  the X-Repo-Commit / ETag / X-Linked-Size / X-Linked-Etag headers

Tests put repositories in `server.repos` and switch faults on: `forbidden`
(repo ids answered 403), `drop_after` (file name -> bytes after which the
connection is cut, once), `wrong_sha` (file names whose listed SHA-256 is
wrong), `ignore_range` (answer 200 with the whole file).

A hostile hub (tests/app/test_hostile_hub.py) lies per repository, through
FakeRepo's fields: `info_patch` rewrites the model-info answer (any JSON
value, or raw bytes), `redirect_loop` answers it with a redirect to itself,
`served` sends other bytes for a file than the listing describes (with
`length` "honest", "none": no Content-Length, the body ends when the
connection closes), `ignore_range`, `gzip_info` (a compressed answer nobody
asked for), `slow_info` / `slow_headers` / `slow_file` send one byte every
so many seconds, and `endless_info` / `endless_file` never stop sending.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, bytes]
    tags: list[str] = field(default_factory=list)
    downloads: int = 0
    likes: int = 0
    last_modified: str = "2025-01-01T00:00:00.000Z"
    license: str | None = "apache-2.0"
    gguf: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    gated: bool | str = False
    lfs_min_size: int = 0  # files at least this big get an LFS entry (real repos: the weights)
    # Lies (see the module docstring).
    info_patch: Callable[[dict[str, Any]], Any] | None = None
    redirect_loop: bool = False
    served: dict[str, bytes] = field(default_factory=dict)
    length: str = "honest"
    ignore_range: bool = False
    gzip_info: bool = False
    slow_info: float = 0.0
    slow_headers: float = 0.0
    slow_file: float = 0.0
    endless_info: bool = False
    endless_file: bool = False

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.repo_id, "modelId": self.repo_id, "tags": self.tags, "downloads": self.downloads,
            "likes": self.likes, "lastModified": self.last_modified, "gated": self.gated,
            "cardData": {"license": self.license} if self.license else {},
        }
        if self.gguf is not None:
            out["gguf"] = self.gguf
        if self.config is not None:
            out["config"] = self.config
        return out


class FakeHub(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.repos: dict[str, FakeRepo] = {}
        self.forbidden: set[str] = set()
        self.drop_after: dict[str, int] = {}
        self.wrong_sha: set[str] = set()
        self.ignore_range = False
        self.stopping = threading.Event()  # ends the slow senders
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range)
        # A short poll: stop() waits for it, once per test.
        self._thread = threading.Thread(target=self.serve_forever, args=(0.05,), name="fake-hf-hub", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> FakeHub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.shutdown()
        self.server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-file (pause, cancel) is normal here."""
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, BrokenPipeError)):
            super().handle_error(request, client_address)

    def add(self, repo: FakeRepo) -> FakeRepo:
        self.repos[repo.repo_id] = repo
        return repo

    def info(self, repo: FakeRepo) -> dict[str, Any]:
        siblings = []
        for name, data in repo.files.items():
            sibling: dict[str, Any] = {"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest()}
            if len(data) >= repo.lfs_min_size and (name.endswith((".gguf", ".safetensors"))):
                sha = hashlib.sha256(data).hexdigest()
                if name in self.wrong_sha:
                    sha = "0" * 64
                sibling["lfs"] = {"size": len(data), "sha256": sha, "pointerSize": 134}
            siblings.append(sibling)
        info = {**repo.summary(), "sha": COMMIT, "siblings": siblings, "private": False}
        return repo.info_patch(info) if repo.info_patch is not None else info


class _Handler(BaseHTTPRequestHandler):
    server: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def do_HEAD(self) -> None:  # noqa: N802
        self._route(head=True)

    def do_GET(self) -> None:  # noqa: N802
        self._route(head=False)

    def _route(self, head: bool) -> None:
        url = urlparse(self.path)
        path = unquote(url.path)
        self.server.requests.append((self.command, path, self.headers.get("Range")))
        query = parse_qs(url.query)
        if path == "/api/models":
            return self._models(query)
        if path.startswith("/api/models/"):
            repo_id = path.removeprefix("/api/models/").split("/revision/")[0]
            return self._repo_info(repo_id)
        if "/resolve/" in path:
            repo_part, _, rest = path.lstrip("/").partition("/resolve/")
            _rev, _, name = rest.partition("/")
            return self._file(repo_part, name, head)
        self._json(404, {"error": "not found"})

    def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _forever(self, start: bytes, filler: bytes) -> None:
        """`start`, then `filler` over and over until the client hangs up."""
        self.close_connection = True
        self.wfile.write(start)
        block = filler * (65536 // len(filler))
        while not self.server.stopping.is_set():
            self.wfile.write(block)

    def _trickle(self, data: bytes, every: float) -> None:
        """`data` one byte at a time, `every` seconds apart, until the client hangs up."""
        for i in range(len(data)):
            if self.server.stopping.wait(every):
                return
            self.wfile.write(data[i:i + 1])
            self.wfile.flush()

    def _models(self, query: dict[str, list[str]]) -> None:
        text = (query.get("search") or [""])[0].lower()
        found = [r for r in self.server.repos.values() if text in r.repo_id.lower()]
        sort = (query.get("sort") or ["downloads"])[0]
        key = {"downloads": lambda r: r.downloads, "likes": lambda r: r.likes,
               "lastModified": lambda r: r.last_modified}.get(sort, lambda r: r.downloads)
        # A hostile repository's counts may be text: order numbers among numbers, text among text.
        found.sort(key=lambda r: (0, key(r), "") if isinstance(key(r), int) else (1, 0, str(key(r))), reverse=True)
        limit = int((query.get("limit") or ["1000"])[0])
        self._json(200, [r.summary() for r in found[:limit]])

    def _repo_info(self, repo_id: str) -> None:
        repo = self.server.repos.get(repo_id)
        if repo is None:
            return self._json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
        if repo_id in self.server.forbidden:
            return self._json(403, {"error": "Access to this model is restricted; accept its licence."},
                              {"X-Error-Code": "GatedRepo"})
        if repo.redirect_loop:
            self.send_response(302)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if repo.endless_info:
            self.send_response(200)
            self.send_header("Connection", "close")  # no length: the body ends when the connection does
            self.end_headers()
            return self._forever(b"[", b"0,")
        info = self.server.info(repo)
        data = info if isinstance(info, bytes) else json.dumps(info).encode()
        if repo.slow_headers:
            self.close_connection = True
            return self._trickle(b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"x" * 10_000 + b"\r\n\r\n", repo.slow_headers)
        if repo.gzip_info:
            return self._json(200, gzip.compress(data), {"Content-Encoding": "gzip"})
        if repo.slow_info:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            return self._trickle(data, repo.slow_info)
        self._json(200, data)

    def _file(self, repo_id: str, name: str, head: bool) -> None:
        repo = self.server.repos.get(repo_id)
        if repo is None or name not in repo.files:
            return self._json(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
        if repo_id in self.server.forbidden:
            return self._json(403, {"error": "Access restricted"}, {"X-Error-Code": "GatedRepo"})
        data = repo.served.get(name, repo.files[name])
        etag = hashlib.sha256(data).hexdigest()
        start, status = 0, 200
        wanted = self.headers.get("Range")
        end = len(data) - 1
        if wanted and not (self.server.ignore_range or repo.ignore_range):
            spec = wanted.removeprefix("bytes=")
            first, _, last = spec.partition("-")
            start = int(first)
            if last:
                end = min(end, int(last))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        body = data[start:end + 1]
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        if repo.length == "none" or repo.endless_file:
            self.close_connection = True  # the body ends when the connection does
            self.send_header("Connection", "close")
        else:
            self.send_header("Content-Length", str(len(body)))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{etag}"')
        self.send_header("X-Linked-Size", str(len(data)))
        self.send_header("X-Linked-Etag", f'"{etag}"')
        self.end_headers()
        if head:
            return
        if repo.endless_file:
            return self._forever(body, b"\0")
        if repo.slow_file:
            self.close_connection = True
            return self._trickle(body, repo.slow_file)
        cut = self.server.drop_after.pop(name, None)
        if cut is not None and cut < len(body):
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)  # the connection drops mid-file
            return
        self.wfile.write(body)
