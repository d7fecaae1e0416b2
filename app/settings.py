"""The application's settings: defaults in code, one JSON file on disk.

The file lives in the platform's user config folder (platformdirs
`user_config_dir("Tandem")`), or in `$TANDEM_CONFIG_DIR` when that is set.
Every key is optional, a missing file means the defaults, and unknown keys
are ignored (a newer version may have written them). A file that cannot be read, or a value that is not valid,
never stops the application: the valid values are used, the rest fall back to
their defaults, the file is kept aside as `settings.json.bad` for the user to
look at, and `load_warning` says what happened. The file is read as
app.files.read_json_file reads any file a user may edit: a regular file only
(a FIFO or /dev/zero in its place is kept aside unread), at most
app.files.MAX_CONFIG_FILE_BYTES, and any JSON (a 5,000-digit number, nesting
100,000 deep) is a warning, never an exception.

The config folder is private (0700) and the file in it 0600, like every
file Tandem writes (app.files); an existing looser one is tightened when the
settings are read.

The rules for each value live in one table (`_RULES`), used both when the
file is read and when the settings dialog checks what the user typed, so the
two never disagree: `check_value(key, value)` says why a value is refused,
`Settings.problems()` lists everything wrong with a whole settings object,
and `save()` refuses to write settings that would not load back cleanly.
"""

from __future__ import annotations

import json
import os
import reprlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import platformdirs

from app.workspace.conversation import CONTEXT_POLICIES
from app.errors import AppError
from app.files import (
    UnreadableFileError,
    make_private_file,
    make_private_folder,
    read_json_file,
    set_aside,
    write_text_atomically,
)
from engine.config import DEVICES, DTYPES, EngineConfig
from engine.params import InvalidSamplingParams, SamplingParams

SETTINGS_FILE_NAME = "settings.json"

THEMES = ("system", "light", "dark")
# The engine takes any page size of at least 1. Settings keep to powers of two
# up to 256: a power of two turns the `pos // page_size`, `pos % page_size` of
# every attention step into shifts and masks, and the prefix cache shares whole
# pages only, so past a few hundred tokens a page would rarely be shared at all.
PAGE_SIZES = tuple(1 << i for i in range(9))  # 1, 2, 4, ..., 256
DEFAULT_PAGE_SIZE = 16
# The sampling parameters a user sets per pane; the others (stop strings,
# ignore_eos) are for programs, not people.
PARAM_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens", "seed")


# The sampling defaults before issue 29: temperature 0.7 with nothing cut off made
# small models write gibberish. A file holding exactly these never chose them.
_OLD_DEFAULTS = {"temperature": 0.7, "top_p": 1.0, "top_k": 0, "min_p": 0.0}


def config_dir() -> Path:
    """`$TANDEM_CONFIG_DIR` if set, else the platform's config folder for Tandem."""
    override = os.environ.get("TANDEM_CONFIG_DIR")
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_config_dir("Tandem", appauthor=False))


def settings_path() -> Path:
    return config_dir() / SETTINGS_FILE_NAME


def ensure_config_dir() -> Path:
    """`config_dir()`, created private (0700) or tightened to that; returns it. Raises OSError."""
    return make_private_folder(config_dir())


def _prepare_folder(folder: Path) -> None:
    """A settings file's folder: created 0700 when missing; the config folder tightened to that.

    A folder that exists and is not Tandem's config folder keeps its mode."""
    if folder == config_dir() or not folder.exists():
        make_private_folder(folder)


# The conversation text's zoom, in percent of the normal size.
MIN_TEXT_ZOOM, MAX_TEXT_ZOOM = 50, 300


@dataclass(slots=True)
class Settings:
    model: str = "default"  # "default", a model folder or a .gguf file
    device: str = "auto"
    dtype: str = "auto"
    # Engine CPU threads; None leaves it to the engine's policy (which keeps
    # a core for the GUI thread on a small machine).
    threads: int | None = None
    kv_cache_mb: int | None = None  # None: the engine's default KV-cache size
    page_size: int = DEFAULT_PAGE_SIZE  # tokens per KV-cache page
    # What a new pane does when its conversation outgrows the model's context:
    # "stop" (refuse the turn, say why) or "drop_oldest" (leave the oldest
    # turns out of the prompt, keeping the system prompt).
    context_policy: str = "stop"
    default_params: SamplingParams = field(default_factory=SamplingParams)
    default_system_prompt: str = ""
    theme: str = "system"
    # The conversation text's size in percent of the normal size (View → Zoom; Ctrl+= / Ctrl+- / Ctrl+0).
    text_zoom: int = 100
    # Free-form state the window keeps between runs (geometry, splitter sizes).
    ui_state: dict[str, Any] = field(default_factory=dict)
    # Not saved: what went wrong reading the file, for the window to show once.
    load_warning: str | None = field(default=None, compare=False)

    # -- reading -------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path | None = None) -> Settings:
        """The settings in `path` (default: `settings_path()`); defaults where absent or invalid."""
        path = Path(path) if path is not None else settings_path()
        try:
            raw = read_json_file(path)
        except FileNotFoundError:
            return cls()
        except UnreadableFileError as exc:
            return cls._bad_file(path, exc.reason)
        _tighten(path)
        if not isinstance(raw, dict):
            return cls._bad_file(path, "it does not hold a JSON object")
        settings, problems = cls.from_dict(raw)
        if problems:
            kept = set_aside(path)
            settings.load_warning = (
                f"Some settings in {path} were not valid and the defaults are used for them: "
                + "; ".join(problems)
                + (f". The file was kept as {kept}." if kept else ".")
            )
        return settings

    @classmethod
    def _bad_file(cls, path: Path, why: str) -> Settings:
        kept = set_aside(path)
        settings = cls()
        settings.load_warning = (
            f"The settings file {path} was not used because {why}; the defaults are used instead."
            + (f" The file was kept as {kept}." if kept else "")
        )
        return settings

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> tuple[Settings, list[str]]:
        """Settings from a JSON object, and a description of each value that was not valid."""
        settings = cls()
        problems: list[str] = []
        for key, rule in _RULES.items():
            if key not in raw:
                continue
            value = raw[key]
            if rule.ok(value):
                setattr(settings, key, value)
            else:
                problems.append(f"{key} must be {rule.allowed}, not {_shown(value)}")

        params = raw.get("default_params")
        if params is not None:
            if not isinstance(params, dict):
                problems.append(f"default_params must be an object, not {_shown(params)}")
            else:
                values: dict[str, Any] = {}
                if all(params.get(k) == v for k, v in _OLD_DEFAULTS.items()):
                    # Saved with the old defaults, which nobody chose (every save
                    # wrote them): today's, and a model's recommendation, apply.
                    params = {k: v for k, v in params.items() if k not in _OLD_DEFAULTS}
                for key in PARAM_FIELDS:
                    if key not in params:
                        continue
                    try:  # validate each value on its own, so one bad value costs only itself
                        SamplingParams(**{key: params[key]})
                    except (InvalidSamplingParams, TypeError, ValueError, OverflowError) as exc:
                        problems.append(f"default_params.{_clipped(str(exc))}")
                    else:
                        values[key] = params[key]
                try:
                    settings.default_params = SamplingParams(**values)
                except (InvalidSamplingParams, TypeError, ValueError, OverflowError) as exc:
                    # Each value is valid alone but not with the others: none of them is used.
                    problems.append(f"default_params do not go together ({_clipped(str(exc))})")
        return settings, problems

    # -- checking --------------------------------------------------------------

    def problems(self) -> list[SettingProblem]:
        """Every value that is not valid, each with the reason (empty: all valid)."""
        found = []
        for key in _RULES:
            reason = check_value(key, getattr(self, key))
            if reason is not None:
                found.append(SettingProblem(key, reason))
        if not isinstance(self.default_params, SamplingParams):
            found.append(SettingProblem("default_params", "The default sampling parameters are missing."))
        return found

    def validate(self) -> None:
        """Raise InvalidSettingsError (with every reason) unless all values are valid."""
        found = self.problems()
        if found:
            raise InvalidSettingsError(found)

    # -- writing ---------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "load_warning":
                continue
            value = getattr(self, f.name)
            if f.name == "default_params":
                value = {key: getattr(value, key) for key in PARAM_FIELDS}
            out[f.name] = value
        return out

    def save(self, path: str | Path | None = None) -> Path:
        """Write the settings atomically (a crash leaves the old file or the new one, never half of one).

        Raises InvalidSettingsError, writing nothing, when a value is not
        valid: a file the next start would have to set aside helps nobody.
        """
        self.validate()
        path = Path(path) if path is not None else settings_path()
        _prepare_folder(path.parent)
        return write_text_atomically(path, json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n")

    def engine_kwargs(self) -> dict[str, Any]:
        """The Engine options these settings choose, by EngineConfig's names
        and checked by it (engine.config.InvalidEngineConfig for a value it
        refuses); the options the settings leave alone are absent."""
        chosen: dict[str, Any] = {
            "model": self.model,
            "device": self.device,
            "dtype": self.dtype,
            "threads": self.threads,
            "page_size": self.page_size,
        }
        if self.kv_cache_mb is not None:
            chosen["kv_cache_bytes"] = self.kv_cache_mb * 1024 * 1024
        config = EngineConfig(**chosen)
        return {name: getattr(config, name) for name in chosen}

    def engine_config(self, **options: Any) -> EngineConfig:
        """The EngineConfig these settings choose, with `options` (EngineConfig
        fields, e.g. a model's own max_context) over them."""
        return EngineConfig(**{**self.engine_kwargs(), **options})


@dataclass(slots=True, frozen=True)
class SettingProblem:
    key: str  # the Settings field, e.g. "page_size"
    message: str  # a sentence for a person: what is wrong and what is allowed


class InvalidSettingsError(AppError):
    """Settings with values that are not valid; `problems` names each one."""

    def __init__(self, problems: list[SettingProblem]) -> None:
        self.problems = list(problems)
        super().__init__(" ".join(problem.message for problem in self.problems))


@dataclass(slots=True, frozen=True)
class _Rule:
    label: str  # how the settings dialog names the value
    ok: Callable[[Any], bool]
    allowed: str  # completes "<label> must be ..."


_RULES: dict[str, _Rule] = {
    "model": _Rule("The model", lambda v: isinstance(v, str) and v != "", "a model name, folder or file"),
    "device": _Rule("The device", lambda v: v in DEVICES, " or ".join(DEVICES)),
    "dtype": _Rule("The data type", lambda v: v in DTYPES, " or ".join(DTYPES)),
    "threads": _Rule(
        "CPU threads", lambda v: v is None or (_is_int(v) and v >= 1),
        "a whole number of at least 1, or automatic (null)",
    ),
    "kv_cache_mb": _Rule(
        "The KV cache budget", lambda v: v is None or (_is_int(v) and v >= 1),
        "a whole number of megabytes of at least 1, or the engine's default (null)",
    ),
    "page_size": _Rule(
        "The page size", lambda v: _is_int(v) and v in PAGE_SIZES,
        "a power of two from 1 to 256 tokens (1, 2, 4, ..., 256)",
    ),
    "context_policy": _Rule(
        "The context overflow policy", lambda v: v in CONTEXT_POLICIES,
        " or ".join(f'"{p}"' for p in CONTEXT_POLICIES),
    ),
    "default_system_prompt": _Rule("The default system prompt", lambda v: isinstance(v, str), "text"),
    "theme": _Rule("The theme", lambda v: v in THEMES, " or ".join(THEMES)),
    "text_zoom": _Rule(
        "The text zoom", lambda v: _is_int(v) and MIN_TEXT_ZOOM <= v <= MAX_TEXT_ZOOM,
        f"a whole percentage from {MIN_TEXT_ZOOM} to {MAX_TEXT_ZOOM}",
    ),
    "ui_state": _Rule("The window state", lambda v: isinstance(v, dict), "an object"),
}


def check_value(key: str, value: Any) -> str | None:
    """Why `value` is not valid for the setting `key`, as a sentence; None when it is.

    For the sampling defaults, build a SamplingParams: it checks its own
    values and its InvalidSamplingParams says why.
    """
    rule = _RULES.get(key)
    if rule is None:
        raise KeyError(f"no setting named {key!r}")
    if rule.ok(value):
        return None
    return f"{rule.label} must be {rule.allowed}, not {value!r}."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# How a warning quotes a value from the file: a 4 MB string or a list 900 deep in a
# hand-edited file must not make a 4 MB warning.
_QUOTE = reprlib.Repr()
_QUOTE.maxlevel, _QUOTE.maxstring, _QUOTE.maxlong, _QUOTE.maxother = 3, 80, 40, 80
_QUOTE.maxlist = _QUOTE.maxdict = 6
_MAX_PROBLEM_CHARS = 300


def _shown(value: Any) -> str:
    """A value from the file as a warning quotes it: short, whatever its size or depth."""
    try:
        return _QUOTE.repr(value)
    except (ValueError, RecursionError):  # an integer longer than Python writes out
        return "a value too long to show"


def _clipped(text: str) -> str:
    return text if len(text) <= _MAX_PROBLEM_CHARS else text[: _MAX_PROBLEM_CHARS - 1] + "…"


def _tighten(path: Path) -> None:
    """A settings file an older Tandem wrote 0644 (and its folder, when it is the config folder) made private."""
    make_private_file(path)
    if path.parent == config_dir():
        try:
            make_private_folder(path.parent)
        except OSError:  # read-only: the settings are still usable
            pass

