"""Finding models on Hugging Face: search, a repository's files, and what fits.

`search_models(text)` asks the Hub (HF_ENDPOINT, a mirror or a company proxy
included, with HF_TOKEN) for model repositories and keeps those Tandem runs:
the architectures of its model families (engine/model/families) stored as
GGUF files or as a safetensors folder. `repo_files(repo_id)` lists a
repository's downloadable choices — each GGUF quantization, or the
safetensors folder as one choice — with sizes and the SHA-256 the Hub keeps
for each large file. `assess_choices` says for each choice whether it fits
this machine's free memory and disk, with the memory estimate from the
engine's own sizing rules (app/models/memory_estimate.py) on the model's
shape, read from a GGUF header fetched by range or from config.json, and
picks a recommended one.

Whatever answers on HF_ENDPOINT is untrusted (docs/security.md): every
request goes through `hub_read`/`hub_stream`, which read at most what was
asked within a wall-clock deadline, and every name the Hub sends is checked
here (`check_repo_id`, `check_commit`, `check_file_name`) before app/models
builds a path or a request from it. A malformed answer is a HubError.

No Qt and no torch at import: `tandem models` runs without either; the
estimate imports them only when asked.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TypeGuard
from urllib.parse import quote

from app.models.errors import HubAccessError, HubError, HubOfflineError, ModelError
from app.models.hub_http import hub_endpoint, hub_host, hub_read, shown
from engine.errors import EngineError
from engine.inspect import FAMILIES

log = logging.getLogger(__name__)

# What the Hub calls the models of each family Tandem runs (engine/model/families):
# config.json model_types, GGUF architectures and the Hub's own tags.
RUNNABLE_ARCHITECTURES = tuple(sorted({
    name for family in FAMILIES for name in (*family.model_types, *family.gguf_architectures, *family.hub_tags)
}))
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

# A search answer or a repository's file list: a real one is well under a
# megabyte; parsed, the JSON takes about 20 times its size.
MAX_LISTING_BYTES = 16 << 20
MAX_FILE_BYTES = 1 << 40  # a size beyond this in a file list is a lie, not a model

# Names as the Hub allows them (huggingface_hub's validate_repo_id, ASCII only).
_REPO_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"(?:{_REPO_PART}/)?{_REPO_PART}")
_REVISION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]{0,254}")
_COMMIT = re.compile(r"[0-9a-fA-F]{40}")
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_DRIVE = re.compile(r"[A-Za-z]:")
# One part of a file name, in bytes: room left for ".part" and the OS's 255.
_MAX_NAME_PART = 200

ChoiceKind = Literal["gguf", "folder"]


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


# ---------------------------------------------------------------------------
# Names the Hub sends: the one place they are checked


def malformed(repo_id: str, detail: str) -> HubError:
    return HubError(f"The file list {hub_host()} sent for {repo_id} cannot be used: {detail}. "
                    "Nothing was downloaded; check HF_ENDPOINT or try again later.")


def is_repo_id(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and bool(_REPO_ID.fullmatch(value)) and ".." not in value and "--" not in value


def check_repo_id(value: object, answered_for: str | None = None) -> str:
    """`value` as an 'owner/name' repository id, or HubError. `answered_for`:
    the id the user asked for, when `value` is what the Hub answered."""
    if is_repo_id(value):
        return value
    if answered_for is not None:
        raise malformed(answered_for, f"it gives the repository id {shown(value)}")
    raise HubError(f"{shown(value)} is not a Hugging Face repository id: it is owner/name, in letters, digits, "
                   "'-', '_' and '.'.")


def check_revision(value: object) -> str:
    if isinstance(value, str) and _REVISION.fullmatch(value) and ".." not in value:
        return value
    raise HubError(f"{shown(value)} is not a revision: give a branch, a tag or a commit.")


def check_commit(value: object, repo_id: str) -> str:
    """The commit a listing is downloaded at: exactly 40 hex digits (it names a folder on disk)."""
    if isinstance(value, str) and _COMMIT.fullmatch(value):
        return value.lower()
    raise malformed(repo_id, f"its commit is {shown(value)}, not 40 hex digits")


def check_file_name(value: object, repo_id: str) -> str:
    """A file name from the Hub as a relative path that stays inside the
    folder it is downloaded to: no '..', no absolute or drive path, no
    backslash (Windows reads `..\\x` as a parent), no control character."""
    problem = _name_problem(value)
    if problem is None:
        assert isinstance(value, str)
        return value
    raise malformed(repo_id, f"it names a file {shown(value)}, {problem}")


def _name_problem(name: object) -> str | None:
    if not isinstance(name, str):
        return "which is not text"
    if not name:
        return "which is empty"
    if not name.isprintable():
        return "with a control character in it"
    if "\\" in name:
        return "with a backslash in it"
    if name.startswith("/") or _DRIVE.match(name):
        return "which is an absolute path"
    parts = name.split("/")
    if ".." in parts:
        return "which leads out of its folder"
    if any(part in ("", ".") for part in parts):
        return "with an empty part"
    if any(len(part.encode("utf-8", "surrogatepass")) > _MAX_NAME_PART for part in parts):
        return f"with a part longer than {_MAX_NAME_PART} bytes"
    return None


def _label(value: object, limit: int = 64) -> str | None:
    """A short text the Hub sent (a licence) without control characters, or None."""
    if not isinstance(value, str):
        return None
    text = "".join(ch for ch in value[:limit] if ch.isprintable()).strip()
    return text or None


def _count(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


# ---------------------------------------------------------------------------
# Requests (each bounded by app/models/hub_http.py)


def _hub_json(url: str, *, what: str, params: dict[str, Any] | None = None) -> tuple[int, Any]:
    status, body = hub_read(url, what=what, limit=MAX_LISTING_BYTES, headers=auth_headers(), params=params)
    if status != 200:
        return status, None
    try:
        return status, json.loads(body)
    except (ValueError, RecursionError) as exc:  # not JSON or not UTF-8, a 5,000-digit number, deep nesting
        raise HubError(f"{hub_host()} answered {what} with something that is not JSON Tandem can read; "
                       "check HF_ENDPOINT or try again later.") from exc


def check_reachable() -> None:
    """One quick request, so that being offline is said in seconds."""
    refuse_offline_mode()
    try:
        hub_read(f"{hub_endpoint()}/api/models", what="a test request", limit=64 << 10, cut=True,
                 params={"limit": 1}, seconds=_PROBE_TIMEOUT)
    except HubOfflineError as exc:
        raise HubOfflineError(
            f"You seem to be offline: {hub_host()} cannot be reached. Models on this computer work as usual."
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
    # Asked for more than shown: the filter below drops other architectures.
    params: dict[str, Any] = {"sort": SORT_KEYS[sort], "limit": limit * 3, "expand": expand}
    if text:
        params["search"] = text
    status, answer = _hub_json(f"{hub_endpoint()}/api/models", what="the search", params=params)
    if status in (401, 403):
        raise HubAccessError(f"{hub_host()} refused the token Tandem sent (HF_TOKEN, or the one `hf auth login` "
                             "saved); set a valid read token or remove it, then search again.")
    if status != 200:
        raise HubError(f"{hub_host()} answered {status} to the search; try again later.")
    if not isinstance(answer, list):
        raise HubError(f"{hub_host()} answered the search with something other than a list of models; "
                       "check HF_ENDPOINT or try again later.")
    found: list[HubModel] = []
    for item in answer:
        model = _runnable(item)
        if model is not None:
            found.append(model)
        if len(found) >= limit:
            break
    return found


def _runnable(item: Any) -> HubModel | None:
    """A search result Tandem runs, or None (another architecture, or an
    entry it cannot read: one odd entry is not a failed search)."""
    if not isinstance(item, dict):
        return None
    repo_id = item.get("id") or item.get("modelId")
    if not is_repo_id(repo_id):
        return None
    raw_tags = item.get("tags")
    tags = {t for t in raw_tags if isinstance(t, str)} if isinstance(raw_tags, list) else set()
    gguf, config = _object(item.get("gguf")), _object(item.get("config"))
    named = gguf.get("architecture") or config.get("model_type")
    architecture = named if isinstance(named, str) else ""
    if not architecture:
        architecture = next((t for t in tags if t in RUNNABLE_ARCHITECTURES), "")
    if architecture not in RUNNABLE_ARCHITECTURES:
        return None
    formats = tuple(f for f in ("gguf", "safetensors") if f in tags or (f == "gguf" and gguf))
    if not formats:
        return None
    parameters = _count(gguf.get("total"))
    if parameters is None:
        parameters = _count(_object(item.get("safetensors")).get("total"))
    license_name = _label(_object(item.get("cardData")).get("license")) or next(
        (_label(t.removeprefix("license:")) for t in sorted(tags) if t.startswith("license:")), None)
    return HubModel(
        repo_id=repo_id, formats=formats, architecture=architecture, downloads=_count(item.get("downloads")),
        likes=_count(item.get("likes")), last_modified=_time(item.get("lastModified")), license=license_name,
        parameters=parameters or None, gated=bool(item.get("gated")),
    )


def _time(value: object) -> datetime | None:
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


# ---------------------------------------------------------------------------
# A repository's files


@dataclass(slots=True, frozen=True)
class RemoteFile:
    name: str  # path inside the repository, checked by check_file_name
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
    commit: str  # 40 hex digits: the revision every file is downloaded at, so the set stays consistent
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
        raise HubError(f"{self.repo_id} has no file {shown(file_name)}. Its choices: {names}.")


def repo_files(repo_id: str, revision: str | None = None) -> RepoFiles:
    """The downloadable choices of a repository, with sizes and SHA-256.

    Raises HubOfflineError, HubAccessError (gated or private), HubError
    (no such repository, nothing Tandem runs in it, or an answer that
    cannot be used: a commit that is not 40 hex digits, an unsafe file name,
    a size or hash of the wrong kind)."""
    repo_id = check_repo_id(repo_id)
    url = f"{hub_endpoint()}/api/models/{repo_id}"
    if revision is not None:
        url += f"/revision/{quote(check_revision(revision), safe='')}"
    check_reachable()
    status, answer = _hub_json(url, what=f"the file list of {repo_id}", params={"blobs": "true"})
    if status in (401, 403):
        raise HubAccessError(access_message(repo_id))
    if status == 404:
        raise HubError(f"There is no model repository '{repo_id}' on {hub_endpoint()} (or it is private: "
                       "set HF_TOKEN to a token that may read it).")
    if status != 200:
        raise HubError(f"{hub_host()} answered {status} for {repo_id}; try again later.")
    return parse_listing(answer, repo_id)


def parse_listing(answer: Any, asked: str) -> RepoFiles:
    """A model-info answer (`/api/models/{repo}?blobs=true`) as RepoFiles, every name and number checked."""
    if not isinstance(answer, dict):
        raise malformed(asked, "it is not a JSON object")
    repo_id = check_repo_id(answer.get("id") or asked, answered_for=asked)
    commit = check_commit(answer.get("sha"), repo_id)
    siblings = answer.get("siblings") or []
    if not isinstance(siblings, list):
        raise malformed(repo_id, "its list of files is not a list")
    files = [_remote_file(item, repo_id) for item in siblings]
    return RepoFiles(
        repo_id=repo_id, commit=commit, choices=tuple(file_choices(files)),
        license=_label(_object(answer.get("cardData")).get("license")), gated=bool(answer.get("gated")),
    )


def _remote_file(item: Any, repo_id: str) -> RemoteFile:
    if not isinstance(item, dict):
        raise malformed(repo_id, f"it lists {shown(item)} as a file")
    name = check_file_name(item.get("rfilename"), repo_id)
    lfs = item.get("lfs")
    if lfs is not None and not isinstance(lfs, dict):
        raise malformed(repo_id, f"the LFS entry of {shown(name)} is not an object")
    size = item.get("size")
    if size is None and lfs is not None:
        size = lfs.get("size")
    if type(size) is not int or not 0 <= size <= MAX_FILE_BYTES:
        raise malformed(repo_id, f"the size of {shown(name)} is {shown(size)}, not a number of bytes")
    sha256 = lfs.get("sha256") if lfs is not None else None
    if sha256 is not None and not (isinstance(sha256, str) and _SHA256.fullmatch(sha256)):
        raise malformed(repo_id, f"the SHA-256 of {shown(name)} is {shown(sha256)}, not 64 hex digits")
    return RemoteFile(name, size, sha256.lower() if sha256 is not None else None)


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
    from engine import model_files as default_model

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
    """The shape, or None: the estimate is a hint, and a header or config.json
    the Hub cannot give or the engine cannot read leaves it "unknown"."""
    try:
        return model_shape(listing, choice)
    except (ModelError, EngineError, OSError, ValueError, RecursionError) as exc:
        log.info("no memory estimate for %s (%s): %s", listing.repo_id, choice.label, exc)
        return None


def model_shape(listing: RepoFiles, choice: FileChoice) -> Any:
    """The model's engine ModelShape: from config.json for a folder, from the
    GGUF header (its first megabytes, fetched by range into a sparse file and
    read by the engine's own reader) for a GGUF file."""
    from app.models.download import fetch_range, fetch_small

    if choice.kind == "folder":
        from engine.inspect import ModelShape
        from engine.inspect import ModelConfig

        with tempfile.TemporaryDirectory(prefix="tandem-config-") as tmp:
            (Path(tmp) / "config.json").write_bytes(fetch_small(listing.repo_id, listing.commit, "config.json"))
            return ModelShape.from_config(ModelConfig.from_folder(Path(tmp)))
    from app.models.checks import gguf_shape, read_gguf_summary

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
                return gguf_shape(read_gguf_summary(path))
            except ModelError as exc:
                last_error = exc
        if length >= remote.size:
            break
    raise HubError(f"The header of {remote.name} could not be read: {last_error}")


def access_message(repo_id: str) -> str:
    return (
        f"{repo_id} is gated or private: open {hub_endpoint()}/{repo_id} in a browser, sign in and accept "
        "its licence, then create a read token (Settings → Access Tokens) and set it as HF_TOKEN (or run "
        "`hf auth login`), then try again (restart Tandem if it is running)."
    )
