"""Getting models from Hugging Face (app/models/hub.py, download.py, cli.py),
against a local stand-in for the Hub (tests/app/hf_server.py) serving tiny
models the tests write: the tiny random Llama as GGUF files (Q8_0 and F32)
and as a safetensors folder. No test reaches the network.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q

from app.models import download as download_module
from app.models.download import (
    DownloadControl,
    DownloadProgress,
    download_choice,
    download_folder,
    partial_bytes,
)
from app.models.errors import (
    ChecksumMismatchError,
    DownloadCancelledError,
    DownloadPausedError,
    DuplicateModelError,
    HubAccessError,
    HubOfflineError,
    ModelStorageError,
)
from app.models.hub import assess_choices, quantization_of, repo_files, search_models
from app.models.registry import ModelRegistry
from engine import Engine
from tests.app.hf_server import COMMIT, FakeHub, FakeRepo
from tests.engine.test_gguf_import import write_gguf

GGUF_REPO = "tandem-test/Tiny-Llama-GGUF"
FOLDER_REPO = "tandem-test/Tiny-Llama"
GATED_REPO = "tandem-test/Gated-Llama-GGUF"


@pytest.fixture(scope="module")
def model_files(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict[str, dict[str, bytes]]:
    folder = tmp_path_factory.mktemp("hub-models")
    q8, f32 = folder / "tiny-llama-Q8_0.gguf", folder / "tiny-llama-F32.gguf"
    write_gguf(q8, qtype=Q.Q8_0)
    write_gguf(f32, qtype=Q.F32)
    weights = {p.name: p.read_bytes() for p in tiny_model_dir.iterdir() if p.is_file()}
    return {
        GGUF_REPO: {q8.name: q8.read_bytes(), f32.name: f32.read_bytes(), "README.md": b"# tiny\n"},
        FOLDER_REPO: weights,
    }


def online(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """tests/conftest.py sets HF_HUB_OFFLINE=1 for the whole run; these tests
    go "online" to the local server, with a private cache and no token
    (huggingface_hub reads these settings once, at import)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "hf-home" / "stored_tokens"))


@pytest.fixture
def hub(model_files: dict[str, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeHub]:
    server = FakeHub().start()
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # an empty cache and no saved token
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    online(monkeypatch, tmp_path)
    server.add(FakeRepo(GGUF_REPO, model_files[GGUF_REPO], tags=["gguf", "llama", "license:mit"], downloads=500,
                        last_modified="2024-03-01T00:00:00.000Z", license="mit",
                        gguf={"architecture": "llama", "total": 40_000, "context_length": 256}))
    server.add(FakeRepo(FOLDER_REPO, model_files[FOLDER_REPO], tags=["safetensors", "llama", "text-generation"],
                        downloads=100, last_modified="2025-06-01T00:00:00.000Z",
                        config={"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    server.add(FakeRepo("other/Tiny-Bert", {"model.safetensors": b"x"}, tags=["safetensors", "bert"],
                        downloads=10_000, config={"model_type": "bert"}))
    server.add(FakeRepo(GATED_REPO, model_files[GGUF_REPO], tags=["gguf", "llama"], gated="manual",
                        gguf={"architecture": "llama"}))
    server.forbidden.add(GATED_REPO)
    yield server
    server.stop()


@pytest.fixture
def registry(tmp_path: Path) -> ModelRegistry:
    return ModelRegistry(tmp_path / "data" / "models.json")


def leftovers(registry: ModelRegistry) -> list[str]:
    """What is in the models folder besides registered models."""
    if not registry.imports_dir.exists():
        return []
    known = {e.path.name for e in registry.models() if e.path is not None}
    found = []
    for path in registry.imports_dir.rglob("*"):
        if path.is_file() and path.relative_to(registry.imports_dir).parts[0] not in known:
            found.append(str(path.relative_to(registry.imports_dir)))
    return found


def q8_choice(listing):  # noqa: ANN001, ANN201
    return listing.choice("tiny-llama-Q8_0.gguf")


# ---------------------------------------------------------------------------
# Search and files


def test_search_keeps_what_tandem_runs_sorted_with_details(hub: FakeHub) -> None:
    found = search_models("tiny")
    assert [m.repo_id for m in found] == [GGUF_REPO, FOLDER_REPO]  # bert dropped; the gated one is not "tiny"
    gguf, folder = found
    assert gguf.formats == ("gguf",) and folder.formats == ("safetensors",)
    assert gguf.license == "mit" and gguf.parameters == 40_000 and gguf.downloads == 500
    assert gguf.last_modified is not None and gguf.last_modified.year == 2024
    recent = search_models("tiny", sort="recent")
    assert [m.repo_id for m in recent] == [FOLDER_REPO, GGUF_REPO]
    assert [m.repo_id for m in search_models("llama")] == [GGUF_REPO, FOLDER_REPO, GATED_REPO]
    assert search_models("nothing-matches") == []


def test_search_lists_every_family_tandem_runs(hub: FakeHub) -> None:
    # Named by a GGUF architecture, a config.json model_type, or only by a tag.
    hub.add(FakeRepo("g/gemma-3-1b-it-GGUF", {"m.gguf": b"x"}, tags=["gguf"], gguf={"architecture": "gemma3"}))
    hub.add(FakeRepo("q/Qwen3-0.6B", {"model.safetensors": b"x"}, tags=["safetensors"],
                     config={"model_type": "qwen3"}))
    hub.add(FakeRepo("i/granite-3.3-2b-instruct", {"model.safetensors": b"x"}, tags=["safetensors", "granite"]))
    hub.add(FakeRepo("g/gemma-2-2b-it", {"model.safetensors": b"x"}, tags=["safetensors"],
                     config={"model_type": "gemma2"}))
    hub.add(FakeRepo("s/mamba-130m", {"model.safetensors": b"x"}, tags=["safetensors"],
                     config={"model_type": "mamba"}))
    found = {m.repo_id: m.architecture for m in search_models("-")}
    assert {repo: found.get(repo) for repo in (
        "g/gemma-3-1b-it-GGUF", "q/Qwen3-0.6B", "i/granite-3.3-2b-instruct", "g/gemma-2-2b-it", "s/mamba-130m"
    )} == {
        "g/gemma-3-1b-it-GGUF": "gemma3", "q/Qwen3-0.6B": "qwen3", "i/granite-3.3-2b-instruct": "granite",
        "g/gemma-2-2b-it": "gemma2", "s/mamba-130m": None,
    }


def test_repo_files_lists_quantizations_and_the_folder_with_sizes_and_hashes(
    hub: FakeHub, model_files: dict[str, dict[str, bytes]]
) -> None:
    listing = repo_files(GGUF_REPO)
    assert listing.commit == COMMIT and listing.license == "mit"
    assert [c.label for c in listing.choices] == ["Q8_0", "F32"]  # smallest first; README is no choice
    q8 = q8_choice(listing)
    assert q8.size == len(model_files[GGUF_REPO]["tiny-llama-Q8_0.gguf"])
    assert q8.main_file.sha256 is not None and len(q8.main_file.sha256) == 64
    folder = repo_files(FOLDER_REPO)
    assert [c.kind for c in folder.choices] == ["folder"]
    names = {f.name for f in folder.choices[0].files}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    assert quantization_of("Qwen2.5-0.5B-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert quantization_of("model.IQ3_XS.gguf") == "IQ3_XS"


def test_the_fit_estimate_marks_what_fits_and_recommends_one(hub: FakeHub, tmp_path: Path) -> None:
    listing = repo_files(GGUF_REPO)
    roomy = assess_choices(listing, "cpu", memory_free=1 << 40, disk_free=1 << 40, dest=tmp_path)
    assert [f.mark for f in roomy] == ["fits", "fits"]
    assert [f.recommended for f in roomy] == [True, False]  # Q8_0 before F32
    # The shape came from the GGUF header, fetched by range: the estimate is the engine's.
    assert any(r == "bytes=0-" + str(min(8 << 20, roomy[0].choice.size) - 1) for _, _, r in hub.requests)
    q8, f32 = roomy
    assert q8.memory_bytes is not None and f32.memory_bytes is not None
    assert q8.memory_bytes < f32.memory_bytes  # same KV pool, smaller weights
    assert q8.memory_bytes > q8.choice.size
    between = (q8.memory_bytes + f32.memory_bytes) // 2
    tight = assess_choices(listing, "cpu", memory_free=between, disk_free=1 << 40, dest=tmp_path)
    assert [f.mark for f in tight] == ["fits", "too big for memory"]
    assert tight[0].recommended
    no_disk = assess_choices(listing, "cpu", memory_free=1 << 40, disk_free=10, dest=tmp_path)
    assert {f.mark for f in no_disk} == {"not enough disk"} and not any(f.recommended for f in no_disk)
    assert "not enough disk" in no_disk[0].describe()
    folder = assess_choices(repo_files(FOLDER_REPO), "cpu", memory_free=1 << 40, disk_free=1 << 40, dest=tmp_path)
    assert folder[0].memory_bytes is not None and folder[0].recommended


def test_a_gated_repository_says_how_to_get_access(hub: FakeHub) -> None:
    with pytest.raises(HubAccessError) as caught:
        repo_files(GATED_REPO)
    assert "accept" in str(caught.value) and "HF_TOKEN" in str(caught.value)


def test_offline_is_said_in_one_line_quickly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    closed = FakeHub()  # bound, never serving: then closed, so the port refuses
    endpoint = closed.endpoint
    closed.server_close()
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    online(monkeypatch, tmp_path)
    start = time.monotonic()
    with pytest.raises(HubOfflineError) as caught:
        search_models("llama")
    assert time.monotonic() - start < 10
    assert "offline" in str(caught.value) and "\n" not in str(caught.value)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubOfflineError, match="HF_HUB_OFFLINE"):
        search_models("llama")


# ---------------------------------------------------------------------------
# Downloads


def test_a_gguf_download_is_checked_imported_and_answers(hub: FakeHub, registry: ModelRegistry) -> None:
    listing = repo_files(GGUF_REPO)
    seen: list[DownloadProgress] = []
    entry = download_choice(registry, listing, q8_choice(listing), on_progress=seen.append)
    assert entry.kind == "gguf" and entry.downloaded and entry.kind_label == "Downloaded GGUF"
    assert entry.source == Path(GGUF_REPO) / "tiny-llama-Q8_0.gguf"
    assert registry.get(entry.id) == entry
    assert ModelRegistry(registry.path).get(entry.id) == entry  # saved
    assert [p.stage for p in seen][-1] == "import" and any(p.stage == "download" for p in seen)
    assert seen[-2].fraction == 1.0 or seen[-3].fraction == 1.0
    assert "Downloaded from Hugging Face" in registry.details(entry.id).source
    assert registry.details(entry.id).quantized  # kept quantized
    assert leftovers(registry) == []  # the download folder is gone once imported
    engine = Engine(registry.engine_model(entry.id), device="cpu", dtype="float32", threads=1)
    try:
        assert isinstance(engine.generate("hello", max_tokens=4, temperature=0.0), str)
    finally:
        engine.close()
    with pytest.raises(DuplicateModelError):
        download_choice(registry, listing, q8_choice(listing))


def test_a_dropped_connection_keeps_the_part_and_resume_continues_with_a_range(
    hub: FakeHub, registry: ModelRegistry
) -> None:
    listing = repo_files(GGUF_REPO)
    choice = q8_choice(listing)
    half = choice.size // 2
    hub.drop_after[choice.main_file.name] = half
    with pytest.raises(HubOfflineError) as caught:
        download_choice(registry, listing, choice)
    assert "Resume" in str(caught.value)
    assert [e.id for e in registry.models()] == ["default"]  # nothing registered
    assert partial_bytes(registry.imports_dir, listing, choice) == half
    # As after a restart: a new registry, the same request.
    entry = download_choice(ModelRegistry(registry.path), listing, choice)
    assert ("GET", f"/{GGUF_REPO}/resolve/{COMMIT}/{choice.main_file.name}", f"bytes={half}-") in hub.requests
    assert entry.id in [e.id for e in ModelRegistry(registry.path).models()]
    assert not download_folder(registry.imports_dir, listing).exists()


def test_a_server_that_ignores_the_range_is_downloaded_again_from_the_start(
    hub: FakeHub, registry: ModelRegistry
) -> None:
    listing = repo_files(GGUF_REPO)
    choice = q8_choice(listing)
    hub.drop_after[choice.main_file.name] = 1000
    with pytest.raises(HubOfflineError):
        download_choice(registry, listing, choice)
    hub.ignore_range = True  # answers 200 with the whole file
    entry = download_choice(registry, listing, choice)  # the SHA-256 check passes: no bytes twice
    assert registry.get(entry.id).downloaded


def test_pause_keeps_the_part_and_resume_finishes(
    hub: FakeHub, registry: ModelRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(download_module, "_CHUNK", 4096)
    listing = repo_files(GGUF_REPO)
    choice = q8_choice(listing)
    control = DownloadControl()

    def pause_at_first(progress: DownloadProgress) -> None:
        if progress.stage == "download":
            control.pause.set()

    with pytest.raises(DownloadPausedError) as caught:
        download_choice(registry, listing, choice, on_progress=pause_at_first, control=control)
    assert "Resume" in str(caught.value)
    kept = partial_bytes(registry.imports_dir, listing, choice)
    assert 0 < kept < choice.size
    assert [e.id for e in registry.models()] == ["default"]
    entry = download_choice(registry, listing, choice)
    assert registry.get(entry.id).downloaded


def test_a_checksum_mismatch_is_refused_and_nothing_kept(hub: FakeHub, registry: ModelRegistry) -> None:
    hub.wrong_sha.add("tiny-llama-Q8_0.gguf")
    listing = repo_files(GGUF_REPO)
    with pytest.raises(ChecksumMismatchError) as caught:
        download_choice(registry, listing, q8_choice(listing))
    assert "SHA-256" in str(caught.value)
    assert [e.id for e in registry.models()] == ["default"]
    assert leftovers(registry) == []


def test_a_403_while_downloading_says_how_to_get_access(hub: FakeHub, registry: ModelRegistry) -> None:
    listing = repo_files(GGUF_REPO)
    hub.forbidden.add(GGUF_REPO)  # e.g. the licence was withdrawn meanwhile
    with pytest.raises(HubAccessError) as caught:
        download_choice(registry, listing, q8_choice(listing))
    assert "HF_TOKEN" in str(caught.value)
    assert [e.id for e in registry.models()] == ["default"] and leftovers(registry) == []


def test_a_full_disk_says_so_and_leaves_nothing(
    hub: FakeHub, registry: ModelRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(download_module, "_CHUNK", 4096)
    written = {"bytes": 0}

    def fill_up(out, chunk: bytes) -> None:  # noqa: ANN001
        if written["bytes"] > 8192:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written["bytes"] += len(chunk)
        out.write(chunk)

    monkeypatch.setattr(download_module, "_write", fill_up)
    listing = repo_files(GGUF_REPO)
    with pytest.raises(ModelStorageError) as caught:
        download_choice(registry, listing, q8_choice(listing))
    assert "full" in str(caught.value) and "Free some space" in str(caught.value)
    assert [e.id for e in registry.models()] == ["default"] and leftovers(registry) == []


def test_not_enough_free_space_is_refused_before_downloading(
    hub: FakeHub, registry: ModelRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = shutil.disk_usage
    monkeypatch.setattr(download_module.shutil, "disk_usage", lambda p: real(p)._replace(free=100))
    listing = repo_files(GGUF_REPO)
    with pytest.raises(ModelStorageError, match="more on disk"):
        download_choice(registry, listing, q8_choice(listing))
    assert not any("/resolve/" in path for _method, path, _range in hub.requests)


def test_cancel_leaves_nothing(hub: FakeHub, registry: ModelRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(download_module, "_CHUNK", 4096)
    listing = repo_files(GGUF_REPO)
    control = DownloadControl()
    with pytest.raises(DownloadCancelledError):
        download_choice(registry, listing, q8_choice(listing), on_progress=lambda p: control.cancel.set(),
                        control=control)
    assert [e.id for e in registry.models()] == ["default"]
    assert leftovers(registry) == []
    assert not download_folder(registry.imports_dir, listing).exists()


def test_a_safetensors_folder_download_is_checked_registered_and_removed(
    hub: FakeHub, registry: ModelRegistry
) -> None:
    listing = repo_files(FOLDER_REPO)
    entry = download_choice(registry, listing, listing.choice(None))
    assert (entry.kind, entry.kind_label, entry.source) == ("download", "Downloaded", Path(FOLDER_REPO))
    assert entry.path == registry.imports_dir / entry.id and (entry.path / "config.json").is_file()
    assert ModelRegistry(registry.path).get(entry.id) == entry
    assert registry.details(entry.id).parameters > 0
    assert leftovers(registry) == []
    registry.remove(entry.id)
    assert not entry.path.exists()


def test_a_file_in_the_hugging_face_cache_is_not_downloaded_again(
    hub: FakeHub, registry: ModelRegistry, tmp_path: Path, model_files: dict[str, dict[str, bytes]]
) -> None:
    name = "tiny-llama-Q8_0.gguf"
    cache = tmp_path / "hf-home" / "hub" / f"models--{GGUF_REPO.replace('/', '--')}"
    snapshot = cache / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / name).write_bytes(model_files[GGUF_REPO][name])
    (cache / "refs").mkdir()
    (cache / "refs" / "main").write_text(COMMIT)
    listing = repo_files(GGUF_REPO)
    entry = download_choice(registry, listing, listing.choice(name))
    assert registry.get(entry.id).downloaded
    assert not any(path.endswith(name) for _, path, _ in hub.requests)


# ---------------------------------------------------------------------------
# tandem models


def test_the_models_command(hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    from app.models.cli import main

    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path / "data"))
    assert main(["search", "tiny", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert [m["repo_id"] for m in found] == [GGUF_REPO, FOLDER_REPO]
    assert main(["search", "tiny"]) == 0
    assert GGUF_REPO in capsys.readouterr().out
    assert main(["download", GGUF_REPO, "--file", "tiny-llama-F32.gguf"]) == 0
    out = capsys.readouterr().out
    assert "tiny-llama-f32" in out
    assert main(["list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [m["id"] for m in listed] == ["default", "tiny-llama-f32"]
    assert listed[1]["source"] == f"{GGUF_REPO}/tiny-llama-F32.gguf"
    assert main(["list"]) == 0
    assert "tiny-llama-f32" in capsys.readouterr().out
    assert main(["download", GATED_REPO]) == 1
    assert "HF_TOKEN" in capsys.readouterr().err
    assert main(["download", GGUF_REPO, "--file", "nope.gguf"]) == 1
    assert "no file 'nope.gguf'" in capsys.readouterr().err
    assert main(["remove", "tiny-llama-f32"]) == 0
    assert main(["remove", "tiny-llama-f32"]) == 1
    assert "no model" in capsys.readouterr().err
    assert main(["remove", "default"]) == 1


def test_the_models_command_imports_neither_qt_nor_torch() -> None:
    code = ("import sys, app.models.cli; "
            "bad = [m for m in ('torch', 'PySide6') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stdout + result.stderr
