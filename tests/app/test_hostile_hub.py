"""A hostile Hugging Face hub (issue 27). HF_ENDPOINT is how users reach
mirrors and company proxies, so whatever answers there may lie: about the
commit (once `"sha": "/../../../"` deleted the data folder), the file names,
the sizes, the SHA-256 and the Range; it may trickle a byte every few
seconds or send more than was asked.

Every lie runs through `tandem models` in one child process under a memory
limit (tests/app/hf_server.py plays the hub on 127.0.0.1): it ends in one
clear line, never a traceback, and a canary in the data folder and one
beside it survive every case. The cases that need to look inside (how many
bytes were written, what a read returned) and a download that succeeds and
one that fails beside a stranger's file run here, with the same canaries.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gguf import GGMLQuantizationType as Q

from app.models import download as download_module
from app.models import hub_http
from app.models.download import discard_download, download_choice, download_folder, fetch_range, fetch_small
from app.models.entries import slug
from app.models.errors import ChecksumMismatchError, HubError
from app.models.hub import RepoFiles, assess_choices, check_commit, check_file_name, check_repo_id, repo_files
from app.models.registry import ModelRegistry
from tests.app.hf_server import COMMIT, FakeHub, FakeRepo
from tests.app.test_hub import online
from tests.engine.test_gguf_import import write_gguf

REPO = Path(__file__).resolve().parents[2]
Q8 = "tiny-Q8_0.gguf"
GOOD, DAMAGED = "tandem-test/Good-GGUF", "tandem-test/Damaged-GGUF"
# Memory the child may use above what importing its modules costs.
HEADROOM = 1 << 30
PAD = bytes(3 << 20)  # what a lying hub sends beyond what it should
# The limits the child runs under: (module, name, value); short, so that the
# slow cases end in seconds, and still ample for an honest answer on a busy machine.
LIMITS = [
    ("app.models.hub_http", "HUB_DEADLINE", 2.0),
    ("app.models.download", "STALL_SECONDS", 2.0),
    ("app.models.hub", "MAX_LISTING_BYTES", 1 << 20),
]
SLOW = 0.2  # seconds between the bytes of a trickling answer


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("hostile-hub") / Q8
    write_gguf(path, qtype=Q.Q8_0)
    return path.read_bytes()


def info_with(**changes: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda info: {**info, **changes}


def q8_with(**changes: Any) -> Callable[[dict[str, Any]], Any]:
    """The listing with the GGUF file's entry changed (an `lfs` dict is merged)."""
    lfs_changes = changes.pop("lfs", {})

    def patch(info: dict[str, Any]) -> dict[str, Any]:
        siblings = []
        for sibling in info["siblings"]:
            if sibling["rfilename"] == Q8:
                sibling = {**sibling, **changes, "lfs": {**sibling.get("lfs", {}), **lfs_changes}}
            siblings.append(sibling)
        return {**info, "siblings": siblings}

    return patch


def raw(body: bytes) -> Callable[[dict[str, Any]], Any]:
    return lambda info: body


# case: (the hub's lie as FakeRepo fields, the command, words its one line holds)
FAILURES: dict[str, tuple[dict[str, Any], str, str]] = {
    "sha climbs to the data folder": ({"info_patch": info_with(sha="/../../../")}, "download", "not 40 hex digits"),
    "sha climbs above it": ({"info_patch": info_with(sha="/../../../..")}, "download", "not 40 hex digits"),
    "sha with a NUL": ({"info_patch": info_with(sha="0" * 20 + "\x00" + "0" * 19)}, "download", "not 40 hex"),
    "sha a number": ({"info_patch": info_with(sha=1234)}, "download", "its commit is 1234"),
    "no sha": ({"info_patch": info_with(sha=None)}, "download", "not 40 hex digits"),
    "name climbs out": ({"info_patch": q8_with(rfilename="../../x.gguf")}, "download", "leads out of its folder"),
    "name climbs out on Windows": ({"info_patch": q8_with(rfilename="..\\..\\x.gguf")}, "download", "backslash"),
    "absolute name": ({"info_patch": q8_with(rfilename="/tmp/x.gguf")}, "download", "absolute path"),
    "drive letter": ({"info_patch": q8_with(rfilename="C:x.gguf")}, "download", "absolute path"),
    "NUL in a name": ({"info_patch": q8_with(rfilename="x\x00.gguf")}, "download", "control character"),
    "terminal escape in a name": ({"info_patch": q8_with(rfilename="\x1b]0;x\x07.gguf")}, "files", "control char"),
    "empty name": ({"info_patch": q8_with(rfilename="")}, "download", "which is empty"),
    "numeric name": ({"info_patch": q8_with(rfilename=7)}, "download", "not text"),
    "size as text": ({"info_patch": q8_with(size="1000")}, "files", "not a number of bytes"),
    "negative size": ({"info_patch": q8_with(size=-1000)}, "files", "not a number of bytes"),
    "size of 2^62": ({"info_patch": q8_with(size=1 << 62)}, "files", "not a number of bytes"),
    "sha256 a number": ({"info_patch": q8_with(lfs={"sha256": 12345})}, "download", "not 64 hex digits"),
    "repository id that climbs": ({"info_patch": info_with(id="../../x")}, "download", "repository id '../../x'"),
    "redirect loop": ({"redirect_loop": True}, "files", "in a loop"),
    "not JSON": ({"info_patch": raw(b"<html>busy</html>")}, "files", "not JSON"),
    "nested 100,000 deep": ({"info_patch": raw(b"[" * 100_000 + b"]" * 100_000)}, "files", "not JSON"),
    "5,000-digit size": ({"info_patch": raw(b'{"sha": "%s", "siblings": [{"rfilename": "a.gguf", "size": %s}]}'
                                            % (COMMIT.encode(), b"9" * 5000))}, "files", "not JSON"),
    "files an object": ({"info_patch": info_with(siblings={"a": 1})}, "files", "is not a list"),
    "a list for a repository": ({"info_patch": raw(b"[]")}, "files", "not a JSON object"),
    "compressed answer": ({"gzip_info": True}, "files", "compressed"),
    "longer than listed": ({"served": {Q8: b""}}, "download", "sent more of tiny-Q8_0.gguf"),
    "longer than listed, no length": ({"served": {Q8: b""}, "length": "none"}, "download", "sent more of"),
    "endless file": ({"endless_file": True}, "download", "sent more of tiny-Q8_0.gguf"),
    "endless file list": ({"endless_info": True}, "files", "sent more than 1.0 MB for the file list"),
    "trickled file": ({"slow_file": SLOW}, "download", "sent less than"),
    "trickled file list": ({"slow_info": SLOW}, "files", "did not send the file list"),
    "trickled headers": ({"slow_headers": SLOW}, "files", "did not send the file list"),
}


def case_repo(case: str) -> str:
    return "evil/" + slug(case)


def command(kind: str, repo: str) -> list[str]:
    return ["download", repo, "--file", Q8] if kind == "download" else ["files", repo, "--device", "cpu"]


# The child: the limits set, its memory capped at what its imports took plus
# HEADROOM, then each case through `tandem models`. Anything but the
# command's own exit escapes as it would reach the user: as a traceback.
CHILD = """
import contextlib, importlib, io, json, resource, sys, time
from pathlib import Path
limits, cases, canaries, headroom = (json.loads(arg) for arg in sys.argv[1:5])
for module, name, value in limits:
    setattr(importlib.import_module(module), name, value)
import app.models.registry
from app.models.cli import main
peak = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmPeak"))
resource.setrlimit(resource.RLIMIT_AS, (peak + headroom, peak + headroom))
for case, argv in cases:
    out, err, start = io.StringIO(), io.StringIO(), time.monotonic()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except BaseException as exc:
        code = f"escaped: {type(exc).__name__}: {exc}"
    alive = all(Path(c).is_file() and Path(c).read_text() == "canary" for c in canaries)
    print(json.dumps({"case": case, "code": code, "out": out.getvalue(), "err": err.getvalue(),
                      "seconds": time.monotonic() - start, "canaries": alive}), flush=True)
"""


@pytest.fixture(scope="module")
def child_results(gguf_bytes: bytes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Every case of FAILURES in one child under RLIMIT_AS."""
    root = tmp_path_factory.mktemp("hostile-hub-child")
    data = root / "data"
    canaries = [data / "canary.txt", root / "beside.txt", data / "models" / "canary.txt"]
    for path in canaries:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("canary")
    hub = FakeHub().start()
    files = {Q8: gguf_bytes, "README.md": b"# tiny\n"}
    cases: list[tuple[str, list[str]]] = []
    for case, (fields, kind, _words) in FAILURES.items():
        served = {name: gguf_bytes + PAD for name in fields.get("served", {})}
        hub.add(FakeRepo(case_repo(case), files, **{**fields, "served": served}))
        cases.append((case, command(kind, case_repo(case))))
    cases.append(("repository id asked that climbs", ["download", "../../etc", "--file", Q8]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=hub.endpoint, HF_HOME=str(root / "hf-home"), HF_HUB_OFFLINE="0", NO_PROXY="127.0.0.1",
               TANDEM_DATA_DIR=str(data))
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(LIMITS), json.dumps(cases),
             json.dumps([str(c) for c in canaries]), str(HEADROOM)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
        )
    finally:
        hub.stop()
    results = {r["case"]: r for r in map(json.loads, done.stdout.splitlines())}
    results["_child"] = {"returncode": done.returncode, "stderr": done.stderr, "canaries": canaries, "data": data}
    yield results


def result_of(results: dict[str, Any], case: str) -> dict[str, Any]:
    child = results["_child"]
    assert case in results, f"the child ended before {case!r}: exit {child['returncode']}\n{child['stderr'][-3000:]}"
    return results[case]


@pytest.mark.parametrize("case", [*FAILURES, "repository id asked that climbs"])
def test_each_lie_is_one_clear_line(child_results: dict[str, Any], case: str) -> None:
    result = result_of(child_results, case)
    words = FAILURES[case][2] if case in FAILURES else "is not a Hugging Face repository id"
    assert result["code"] == 1, result
    lines = result["err"].splitlines()
    assert len(lines) == 1 and lines[0].startswith("tandem models: "), result["err"]
    assert words in lines[0], lines[0]
    assert "Traceback" not in result["err"] and "\x1b" not in result["err"] and "\x00" not in result["err"]
    assert result["canaries"], "a canary was deleted"
    assert result["seconds"] < 10  # the slow cases too: their deadline is 2 s here


def test_no_lie_touches_the_data_folder_or_its_neighbour(child_results: dict[str, Any]) -> None:
    child = child_results["_child"]
    assert child["returncode"] == 0 and "Traceback" not in child["stderr"], child["stderr"][-3000:]
    assert all(r["canaries"] for k, r in child_results.items() if k != "_child")
    for path in child["canaries"]:
        assert path.read_text() == "canary", path
    # A lie that stopped a download mid-file keeps its part for Resume (the trickle); every other removed its own.
    downloads = child["data"] / "models" / ".downloads"
    left = [p.relative_to(downloads).as_posix() for p in downloads.rglob("*") if p.is_file()]
    assert left == [f"evil-trickled-file-{COMMIT[:12]}/{Q8}.part"]


# ---------------------------------------------------------------------------
# In this process: what a read returned, what was written


@pytest.fixture
def hub(gguf_bytes: bytes, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeHub]:
    server = FakeHub().start()
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    online(monkeypatch, tmp_path)
    server.add(FakeRepo(GOOD, {Q8: gguf_bytes, "config.json": b"{}" + b" " * (200 << 10)}))
    yield server
    server.stop()


@pytest.fixture
def registry(tmp_path: Path) -> ModelRegistry:
    return ModelRegistry(tmp_path / "data" / "models.json")


def test_a_range_the_server_ignores_is_read_only_as_far_as_asked(
    hub: FakeHub, gguf_bytes: bytes, tmp_path: Path
) -> None:
    hub.repos[GOOD].ignore_range = True
    hub.repos[GOOD].served = {Q8: gguf_bytes + PAD}  # the whole file and then some
    assert fetch_range(GOOD, COMMIT, Q8, 0, 1000) == gguf_bytes[:1000]
    with pytest.raises(HubError, match="ignored the range"):
        fetch_range(GOOD, COMMIT, Q8, 10, 1000)  # what came is not the bytes asked
    # The estimate reads the header from the bytes it asked for.
    fit, = assess_choices(repo_files(GOOD), "cpu", memory_free=1 << 40, disk_free=1 << 40, dest=tmp_path)
    assert fit.memory_bytes is not None and fit.fits


def test_success_and_failure_beside_a_strangers_file(
    hub: FakeHub, registry: ModelRegistry, tmp_path: Path, gguf_bytes: bytes
) -> None:
    """A download removes what it wrote and nothing else, whether it succeeds or fails."""
    data = registry.path.parent
    canaries = [data / "canary.txt", tmp_path / "beside.txt"]
    hub.add(FakeRepo(DAMAGED, {Q8: gguf_bytes}, info_patch=q8_with(lfs={"sha256": "0" * 64})))
    for repo in (GOOD, DAMAGED):
        listing = repo_files(repo)
        stranger = download_folder(registry.imports_dir, listing) / "stranger.gguf.part"  # another choice's part
        for path in (*canaries, stranger):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("canary")
        if repo == GOOD:
            assert registry.get(download_choice(registry, listing, listing.choice(Q8)).id).downloaded
        else:
            with pytest.raises(ChecksumMismatchError, match="SHA-256"):
                download_choice(registry, listing, listing.choice(Q8))
        for path in (*canaries, stranger):
            assert path.read_text() == "canary", path
        assert [p.name for p in stranger.parent.iterdir()] == [stranger.name]


def test_a_small_file_is_read_up_to_its_limit_and_no_further(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(fetch_small(GOOD, COMMIT, "config.json")) == 2 + (200 << 10)
    monkeypatch.setattr(download_module, "MAX_SMALL_FILE_BYTES", 100 << 10)
    with pytest.raises(HubError, match="sent more than 102 KB for config.json"):
        fetch_small(GOOD, COMMIT, "config.json")
    hub.repos[GOOD].length = "none"  # no Content-Length to refuse by: the read itself stops
    with pytest.raises(HubError, match="sent more than"):
        fetch_small(GOOD, COMMIT, "config.json")


@pytest.mark.parametrize("length", ["honest", "none"])
def test_nothing_past_the_listed_size_is_written(
    hub: FakeHub, registry: ModelRegistry, monkeypatch: pytest.MonkeyPatch, gguf_bytes: bytes, length: str
) -> None:
    """Declared as the GGUF's size, sent with 3 MB more: refused before
    writing (a Content-Length that says so) or at the declared size."""
    monkeypatch.setattr(download_module, "_CHUNK", 4096)
    written = [0]
    real_write = download_module._write

    def counting(out: Any, chunk: bytes) -> None:
        written[0] += len(chunk)
        real_write(out, chunk)

    monkeypatch.setattr(download_module, "_write", counting)
    hub.repos[GOOD].served = {Q8: gguf_bytes + PAD}
    hub.repos[GOOD].length = length
    listing = repo_files(GOOD)
    with pytest.raises(ChecksumMismatchError, match=f"more of tiny-Q8_0.gguf than the {len(gguf_bytes):,} bytes"):
        download_choice(registry, listing, listing.choice(Q8))
    assert written[0] <= len(gguf_bytes)
    assert not download_folder(registry.imports_dir, listing).exists()


def test_a_listing_made_elsewhere_is_checked_again_before_any_path(
    hub: FakeHub, registry: ModelRegistry, tmp_path: Path
) -> None:
    """download_choice checks the commit and names itself, and each path
    is checked against where it resolves (a link planted there)."""
    canary = tmp_path / "data" / "canary.txt"
    canary.parent.mkdir(parents=True)
    canary.write_text("canary")
    good = repo_files(GOOD)
    choice = good.choice(Q8)
    for commit in ("/../../../", "/../../../..", "../" * 13 + "x"):
        with pytest.raises(HubError, match="not 40 hex digits"):
            download_choice(registry, RepoFiles(GOOD, commit, good.choices), choice)
    folder = download_folder(registry.imports_dir, good)
    folder.mkdir(parents=True)
    outside = tmp_path / "outside.gguf.part"
    outside.write_text("canary")
    (folder / (Q8 + ".part")).symlink_to(outside)
    with pytest.raises(HubError, match="leads outside"):
        download_choice(registry, good, choice)
    assert canary.read_text() == "canary" and outside.read_text() == "canary"


def test_discarding_a_paused_download_keeps_what_it_did_not_write(hub: FakeHub, registry: ModelRegistry) -> None:
    listing = repo_files(GOOD)
    folder = download_folder(registry.imports_dir, listing)
    folder.mkdir(parents=True)
    (folder / (Q8 + ".part")).write_bytes(b"GGUF")
    (folder / "stranger.txt").write_text("canary")
    discard_download(registry.imports_dir, listing)
    assert not (folder / (Q8 + ".part")).exists()
    assert (folder / "stranger.txt").read_text() == "canary"
    (folder / "stranger.txt").unlink()
    discard_download(registry.imports_dir, listing)
    assert not folder.exists()


GOOD_NAMES = ["model.gguf", "Qwen2.5-0.5B-Instruct-Q4_K_M.gguf", "sub/dir/model-00001-of-00002.safetensors",
              "a..b.gguf", "名前.gguf"]
BAD_NAMES = ["", ".", "..", "../x.gguf", "a/../../x.gguf", "/etc/passwd", "..\\..\\x.gguf", "sub\\x.gguf",
             "C:x.gguf", "c:\\x.gguf", "x\x00.gguf", "x\n.gguf", "\u202egguf.exe", "a//b.gguf", "a/./b.gguf",
             "dir/", "x" * 201 + ".gguf", 7, None, ["x.gguf"], {"x": 1}]


def test_the_names_the_hub_sends_are_checked() -> None:
    for name in GOOD_NAMES:
        assert check_file_name(name, "o/r") == name
    for bad in BAD_NAMES:
        with pytest.raises(HubError) as caught:
            check_file_name(bad, "o/r")
        assert "\n" not in str(caught.value) and "\x00" not in str(caught.value)
    for repo_id in ("owner/name", "gpt2", "Qwen/Qwen2.5-0.5B-Instruct", "a_b/c.d"):
        assert check_repo_id(repo_id) == repo_id
    for bad in ("", "../x", "a/b/c", "a/..", "/a", "a/", "a//b", "a--b/c", "a/b\x00", "a/b\n", "a b/c",
                "a/" + "b" * 97, 5, None):
        with pytest.raises(HubError, match="not a Hugging Face repository id"):
            check_repo_id(bad)
    assert check_commit(COMMIT.upper(), "o/r") == COMMIT
    for bad in (COMMIT[:-1], COMMIT + "0", "g" * 40, "/../../../", COMMIT[:39] + "\x00", 0, None):
        with pytest.raises(HubError, match="not 40 hex digits"):
            check_commit(bad, "o/r")


def test_the_deadline_is_wall_clock_not_per_read(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    """A byte every 0.2 s never trips a per-read timeout; the deadline ends
    the read at once, headers included."""
    import time

    monkeypatch.setattr(hub_http, "HUB_DEADLINE", 1.0)
    for fields in ({"slow_headers": 0.2}, {"slow_info": 0.2}):
        repo = hub.add(FakeRepo("evil/slow", {Q8: b"GGUF"}, **fields))
        start = time.monotonic()
        with pytest.raises(HubError, match="did not send the file list of evil/slow within 1 s"):
            repo_files(repo.repo_id)
        assert time.monotonic() - start < 4


def test_odd_search_results_are_left_out_or_shown_safely(hub: FakeHub) -> None:
    from app.models.hub import search_models

    llama = {"architecture": "llama"}
    odd_values: dict[str, Any] = {"tags": ["gguf", 5, None], "downloads": "many", "likes": -3,
                                  "last_modified": "yesterday", "license": "\x1b]0;pwned\x07MIT"}
    hub.add(FakeRepo("evil/odd-values", {}, gguf=llama, **odd_values))
    hub.add(FakeRepo("evil/../climbs", {}, tags=["gguf"], gguf=llama))
    hub.add(FakeRepo("evil/not-a-list-of-tags", {}, gguf=llama, **{"tags": {"gguf": 1}}))
    found = {m.repo_id: m for m in search_models("evil")}
    assert set(found) == {"evil/odd-values", "evil/not-a-list-of-tags"}  # the id that climbs is left out
    assert found["evil/not-a-list-of-tags"].formats == ("gguf",)  # known by its GGUF details alone
    odd = found["evil/odd-values"]
    assert (odd.downloads, odd.likes, odd.last_modified) == (None, None, None)
    assert odd.license == "]0;pwnedMIT"  # the control characters are gone
