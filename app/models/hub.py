"""Finding models on Hugging Face: search, a repository's files, and what fits.

`search_models(text)` asks the Hub (huggingface_hub's HfApi, so HF_ENDPOINT
and HF_TOKEN are respected) for model repositories and keeps those Tandem
runs: Llama-family architectures (engine/model/config.py
SUPPORTED_MODEL_TYPES) stored as GGUF files or as a safetensors folder.
`repo_files(repo_id)` lists a repository's downloadable choices — each GGUF
quantization, or the safetensors folder as one choice — with sizes and the
SHA-256 the Hub keeps for each large file. `assess_choices` says for each
choice whether it fits this machine's free memory and disk, with the memory
estimate from the engine's own sizing rules (app/models/memory_estimate.py)
on the model's shape, read from a GGUF header fetched by range or from
config.json, and picks a recommended one.

No Qt and no torch at import: `tandem models` runs without either; the
estimate imports them only when asked.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from app.models.errors import HubError, HubOfflineError, HubAccessError

# engine/model/config.py SUPPORTED_MODEL_TYPES, and the GGUF architecture names that import to them.
RUNNABLE_ARCHITECTURES = ("llama", "mistral", "qwen2")
SORT_KEYS = {"downloads": "downloads", "recent": "lastModified", "likes": "likes"}

# Files a safetensors folder needs beside its weights (the tokenizer and the chat template).
FOLDER_EXTRAS = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "tokenizer.model", "model.safetensors.index.json",
)
# The order a quantization is recommended in: a good size/quality balance first.
PREFERRED_QUANTS = ("Q4_K_M", "Q5_K_M", "Q4_K_S", "Q5_K_S", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q3_K_M", "Q3_K_L",
                    "Q2_K", "F16", "BF16", "F32")
_QUANT_RE = re.compile(r"(?i)(?:^|[-_.])((?:I?Q\d(?:_[A-Z0-9]+)*)|BF16|F16|F32)(?=\.gguf$|[-_.])")
# A GGUF header (metadata with the vocabulary, then the tensor table) fits in
# this much of the file for every model Tandem runs; a bigger one is asked for once.
_HEADER_BYTES = (8 << 20, 48 << 20)
_PROBE_TIMEOUT = 5.0

ChoiceKind = Literal["gguf", "folder"]


def hub_endpoint() -> str:
    """The Hub's address: HF_ENDPOINT (a mirror, or the tests' local server) or huggingface.co."""
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")


def hub_api() -> Any:
    from huggingface_hub import HfApi

    return HfApi(endpoint=hub_endpoint())


def auth_headers() -> dict[str, str]:
    """huggingface_hub's own headers: HF_TOKEN or the token `hf auth login` saved."""
    from huggingface_hub.utils import build_hf_headers

    return build_hf_headers()


def refuse_offline_mode() -> None:
    """HF_HUB_OFFLINE=1 (huggingface_hub's switch) means: never go online."""
    from huggingface_hub import constants

    if constants.is_offline_mode():
        raise HubOfflineError(
            "HF_HUB_OFFLINE is set, so Tandem does not go online for models; unset it to search and download."
        )


def check_reachable() -> None:
    """One quick request, so that being offline is said in seconds (the
    library retries a refused connection for half a minute)."""
    import httpx

    refuse_offline_mode()
    try:
        httpx.get(f"{hub_endpoint()}/api/models", params={"limit": 1}, timeout=_PROBE_TIMEOUT)
    except httpx.HTTPError as exc:
        host = urlparse(hub_endpoint()).netloc or hub_endpoint()
        raise HubOfflineError(
            f"You seem to be offline: {host} cannot be reached. Models on this computer work as usual."
        ) from exc


# ---------------------------------------------------------------------------
# Search


@dataclass(slots=True, frozen=True)
class HubModel:
    repo_id: str
    formats: tuple[str, ...]  # "gguf", "safetensors"
    architecture: str  # "llama"
    downloads: int | None = None
    likes: int | None = None
    last_modified: datetime | None = None
    license: str | None = None
    parameters: int | None = None
    gated: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "repo_id": self.repo_id, "formats": list(self.formats), "architecture": self.architecture,
            "downloads": self.downloads, "likes": self.likes,
            "last_modified": self.last_modified.isoformat() if self.last_modified else None,
            "license": self.license, "parameters": self.parameters, "gated": self.gated,
        }


def search_models(text: str, sort: str = "downloads", limit: int = 30) -> list[HubModel]:
    """Model repositories matching `text` that Tandem runs, most downloaded
    (or most recently updated: sort="recent") first.

    Raises HubOfflineError without a network, HubAccessError for a refused
    token, HubError for anything else the Hub answers."""
    if sort not in SORT_KEYS:
        raise HubError(f"Unknown sort '{sort}': choose {', '.join(SORT_KEYS)}.")
    check_reachable()
    expand = ["downloads", "likes", "lastModified", "tags", "gguf", "safetensors", "config", "cardData", "gated"]
    found: list[HubModel] = []
    with _hub_errors("search"):
        # Asked for more than shown: the filter below drops other architectures.
        for info in hub_api().list_models(search=text or None, sort=SORT_KEYS[sort], limit=limit * 3, expand=expand):
            model = _runnable(info)
            if model is not None:
                found.append(model)
            if len(found) >= limit:
                break
    return found


def _runnable(info: Any) -> HubModel | None:
    tags = set(info.tags or ())
    gguf = info.gguf if isinstance(info.gguf, dict) else {}
    config = info.config if isinstance(info.config, dict) else {}
    architecture = str(gguf.get("architecture") or config.get("model_type") or "")
    if not architecture:
        architecture = next((t for t in tags if t in RUNNABLE_ARCHITECTURES), "")
    if architecture not in RUNNABLE_ARCHITECTURES:
        return None
    formats = tuple(f for f in ("gguf", "safetensors") if f in tags or (f == "gguf" and gguf))
    if not formats:
        return None
    parameters = gguf.get("total")
    if parameters is None and info.safetensors is not None:
        parameters = info.safetensors.total
    card = info.card_data
    license_name = (card.get("license") if card is not None else None) or next(
        (t.removeprefix("license:") for t in tags if t.startswith("license:")), None)
    return HubModel(
        repo_id=info.id, formats=formats, architecture=architecture, downloads=info.downloads, likes=info.likes,
        last_modified=info.last_modified, license=license_name,
        parameters=int(parameters) if parameters else None, gated=bool(info.gated),
    )


# ---------------------------------------------------------------------------
# A repository's files


@dataclass(slots=True, frozen=True)
class RemoteFile:
    name: str  # path inside the repository
    size: int
    sha256: str | None  # the Hub's LFS hash; None for a small file kept in git

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "sha256": self.sha256}


@dataclass(slots=True, frozen=True)
class FileChoice:
    """One thing to download: a GGUF file, or a safetensors folder's files."""

    kind: ChoiceKind
    label: str  # "Q4_K_M" / "safetensors (bfloat16)"
    files: tuple[RemoteFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def main_file(self) -> RemoteFile:
        return self.files[0]


@dataclass(slots=True, frozen=True)
class RepoFiles:
    repo_id: str
    commit: str  # the revision every file is downloaded at, so the set stays consistent
    choices: tuple[FileChoice, ...]
    license: str | None = None
    gated: bool = False

    def choice(self, file_name: str | None) -> FileChoice:
        """The choice holding `file_name` (a GGUF file name or one of the
        folder's); None: the recommended-by-default first choice."""
        if not self.choices:
            raise HubError(
                f"{self.repo_id} has no GGUF file and no safetensors folder Tandem can run."
            )
        if file_name is None:
            return self.choices[0]
        for choice in self.choices:
            if any(f.name == file_name for f in choice.files) or choice.label == file_name:
                return choice
        names = ", ".join(c.main_file.name if c.kind == "gguf" else "safetensors" for c in self.choices)
        raise HubError(f"{self.repo_id} has no file '{file_name}'. Its choices: {names}.")


def repo_files(repo_id: str, revision: str | None = None) -> RepoFiles:
    """The downloadable choices of a repository, with sizes and SHA-256.

    Raises HubOfflineError, HubAccessError (gated or private), HubError
    (no such repository, or nothing Tandem runs in it)."""
    check_reachable()
    with _hub_errors(repo_id):
        info = hub_api().model_info(repo_id, revision=revision, files_metadata=True)
    files = [
        RemoteFile(s.rfilename, int(s.size or (s.lfs.size if s.lfs else 0) or 0), s.lfs.sha256 if s.lfs else None)
        for s in info.siblings or ()
    ]
    card = info.card_data
    return RepoFiles(
        repo_id=info.id or repo_id, commit=info.sha or revision or "main", choices=tuple(file_choices(files)),
        license=card.get("license") if card is not None else None, gated=bool(info.gated),
    )


def file_choices(files: Iterable[RemoteFile]) -> list[FileChoice]:
    """Each GGUF file (smallest first; split GGUF parts are left out: the
    importer reads one file) and the safetensors folder, when there is one."""
    files = list(files)
    choices: list[FileChoice] = []
    ggufs = [f for f in files if f.name.lower().endswith(".gguf") and "/" not in f.name
             and not re.search(r"-\d{5}-of-\d{5}\.gguf$", f.name) and "mmproj" not in f.name.lower()]
    for f in sorted(ggufs, key=lambda f: f.size):
        choices.append(FileChoice("gguf", quantization_of(f.name), (f,)))
    weights = [f for f in files if f.name.endswith(".safetensors") and "/" not in f.name]
    names = {f.name for f in files}
    if weights and "config.json" in names:
        extras = [f for f in files if f.name in FOLDER_EXTRAS]
        choices.append(FileChoice("folder", "safetensors folder", tuple(sorted(weights, key=lambda f: f.name)) + tuple(extras)))
    return choices


def quantization_of(file_name: str) -> str:
    """'SmolLM2-135M-Instruct-Q4_K_M.gguf' -> 'Q4_K_M'."""
    match = _QUANT_RE.search(file_name)
    return match.group(1).upper() if match else Path(file_name).stem


# ---------------------------------------------------------------------------
# What fits


@dataclass(slots=True, frozen=True)
class ChoiceFit:
    choice: FileChoice
    memory_bytes: int | None  # what running it takes (None: the model's shape could not be read)
    memory_free: int
    disk_bytes: int  # what the download and its import take on disk
    disk_free: int
    recommended: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def fits_memory(self) -> bool:
        return self.memory_bytes is None or self.memory_bytes <= self.memory_free

    @property
    def fits_disk(self) -> bool:
        return self.disk_bytes <= self.disk_free

    @property
    def fits(self) -> bool:
        return self.fits_memory and self.fits_disk

    @property
    def mark(self) -> str:
        """'fits', 'too big for memory', 'not enough disk'."""
        if not self.fits_disk:
            return "not enough disk"
        if not self.fits_memory:
            return "too big for memory"
        return "fits"

    def describe(self) -> str:
        from engine.progress import format_bytes

        memory = "memory unknown" if self.memory_bytes is None else f"needs about {format_bytes(self.memory_bytes)} of {format_bytes(self.memory_free)} free"
        return (f"{self.choice.label}: {format_bytes(self.choice.size)} download, {memory}, "
                f"{format_bytes(self.disk_free)} free on disk — {self.mark}"
                + (" (recommended)" if self.recommended else ""))


def assess_choices(
    listing: RepoFiles, device: str = "auto", *, dest: Path | None = None,
    memory_free: int | None = None, disk_free: int | None = None, shape: Any = None,
) -> list[ChoiceFit]:
    """Each choice with what it needs against what this machine has free, and
    one marked recommended: the first of PREFERRED_QUANTS that fits, else the
    largest that fits. `shape` (an engine ModelShape) is read from the Hub
    when not given; `memory_free` / `disk_free` default to this machine's."""
    from app.models.memory_estimate import available_memory
    from engine.formats import default_model

    if memory_free is None:
        memory_free = available_memory(device)
    if disk_free is None:
        target = dest or default_model.models_dir()
        probe = next((p for p in (target, *target.parents) if p.exists()), Path.home())
        disk_free = shutil.disk_usage(probe).free
    fits: list[ChoiceFit] = []
    shapes: dict[ChoiceKind, Any] = {}
    for choice in listing.choices:
        if choice.kind not in shapes:
            shapes[choice.kind] = shape if shape is not None else _shape_or_none(listing, choice)
        memory = _memory_needed(choice, shapes[choice.kind], device)
        # A GGUF is imported once into a folder about its size, then the download is deleted.
        disk = choice.size * 2 if choice.kind == "gguf" else choice.size
        fits.append(ChoiceFit(choice, memory, memory_free, disk, disk_free))
    best = _recommended(fits)
    if best is not None:
        fits[best] = ChoiceFit(**{**_fields(fits[best]), "recommended": True})
    return fits


def _fields(fit: ChoiceFit) -> dict[str, Any]:
    return {name: getattr(fit, name) for name in ChoiceFit.__dataclass_fields__}


def _recommended(fits: list[ChoiceFit]) -> int | None:
    fitting = [i for i, f in enumerate(fits) if f.fits]
    if not fitting:
        return None
    for quant in PREFERRED_QUANTS:
        for i in fitting:
            if fits[i].choice.kind == "gguf" and fits[i].choice.label == quant:
                return i
    return max(fitting, key=lambda i: fits[i].choice.size)


def _memory_needed(choice: FileChoice, shape: Any, device: str) -> int | None:
    if shape is None:
        return None
    from app.models.memory_estimate import estimate_memory

    try:
        if choice.kind == "folder":
            return estimate_memory(shape, device).total_bytes
        # The import keeps a GGUF's blocks quantized: its weights take about
        # the file's size; the KV pool and the reserve are the engine's.
        plain = estimate_memory(shape, device)
        return choice.size + plain.kv_bytes + plain.overhead_bytes
    except Exception:  # a device the engine refuses: no estimate, not a failed listing
        return None


def _shape_or_none(listing: RepoFiles, choice: FileChoice) -> Any:
    try:
        return model_shape(listing, choice)
    except (HubError, OSError, ValueError):
        return None


def model_shape(listing: RepoFiles, choice: FileChoice) -> Any:
    """The model's engine ModelShape: from config.json for a folder, from the
    GGUF header (its first megabytes, fetched by range into a sparse file and
    read by the engine's own reader) for a GGUF file."""
    from app.models.download import fetch_range, fetch_small

    if choice.kind == "folder":
        from engine.formats.weight_memory import ModelShape
        from engine.model.config import ModelConfig

        with tempfile.TemporaryDirectory(prefix="tandem-config-") as tmp:
            (Path(tmp) / "config.json").write_bytes(fetch_small(listing.repo_id, listing.commit, "config.json"))
            return ModelShape.from_config(ModelConfig.from_folder(Path(tmp)))
    from app.models.checks import read_gguf_summary
    from app.models.errors import ModelError

    remote = choice.main_file
    last_error: Exception | None = None
    for length in _HEADER_BYTES:
        with tempfile.TemporaryDirectory(prefix="tandem-header-") as tmp:
            path = Path(tmp) / "header.gguf"
            head = fetch_range(listing.repo_id, listing.commit, remote.name, 0, min(length, remote.size))
            with path.open("wb") as out:
                out.write(head)
                out.truncate(remote.size)  # sparse: the tensor data is never fetched
            try:
                return read_gguf_summary(path).shape()
            except ModelError as exc:
                last_error = exc
        if length >= remote.size:
            break
    raise HubError(f"The header of {remote.name} could not be read: {last_error}")


class _hub_errors:
    """huggingface_hub's and httpx's errors as HubError subclasses that say what to do."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _tb: Any) -> bool:
        if exc is None or isinstance(exc, HubError):
            return False
        import httpx
        from huggingface_hub import errors as hf_errors

        if isinstance(exc, (hf_errors.GatedRepoError,)) or _status(exc) in (401, 403):
            raise HubAccessError(access_message(self.what)) from exc
        if isinstance(exc, hf_errors.RepositoryNotFoundError) or _status(exc) == 404:
            raise HubError(f"There is no model repository '{self.what}' on {hub_endpoint()} (or it is private: "
                           "set HF_TOKEN to a token that may read it).") from exc
        if isinstance(exc, httpx.HTTPError):
            raise HubOfflineError(f"The connection to {hub_endpoint()} was lost ({type(exc).__name__}); "
                                  "check the network and try again.") from exc
        if isinstance(exc, (hf_errors.HfHubHTTPError, json.JSONDecodeError)):
            raise HubError(f"Hugging Face answered with an error for {self.what}: {exc}") from exc
        return False


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def access_message(repo_id: str) -> str:
    return (
        f"{repo_id} is gated or private: open {hub_endpoint()}/{repo_id} in a browser, sign in and accept "
        "its licence, then create a read token (Settings → Access Tokens) and set it as HF_TOKEN (or run "
        "`hf auth login`), then try again (restart Tandem if it is running)."
    )
