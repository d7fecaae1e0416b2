"""JSON schemas the user saved by name for "Reply as JSON", kept between runs.

One file in the config folder (`json-schemas.json`, beside settings.json):
``{"schemas": [{"name": ..., "schema": "<the schema's text>"}, ...]}``. It is
read as every file a user may edit is (app.files.read_json_file: a regular
file, at most MAX_CONFIG_FILE_BYTES), and nothing in it can stop the
window: a file that cannot be used is kept aside as `json-schemas.json.bad`
and an entry that is not valid is skipped, each said once in `load_warning`.
A schema keeps the text the user typed (its spacing and key order), no
larger than an engine.structured Constraint accepts.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine.structured import Constraint, InvalidConstraint

from app.errors import AppError
from app.files import (
    MAX_CONFIG_FILE_BYTES, UnreadableFileError, make_private_folder, read_json_file, set_aside, write_text_atomically,
)

SAVED_SCHEMAS_FILE_NAME = "json-schemas.json"
MAX_SAVED_SCHEMAS = 100
MAX_NAME_CHARS = 80


class SavedSchemaError(AppError):
    """A schema that cannot be saved under that name (the message says why)."""


def saved_schemas_path() -> Path:
    from app.settings import config_dir

    return config_dir() / SAVED_SCHEMAS_FILE_NAME


class SavedSchemas:
    """Name -> schema text, in the order saved. `load` never raises."""

    def __init__(self, path: Path | None = None, schemas: dict[str, str] | None = None) -> None:
        self.path = path if path is not None else saved_schemas_path()
        self.schemas: dict[str, str] = dict(schemas or {})
        self.load_warning: str | None = None

    @classmethod
    def load(cls, path: str | Path | None = None) -> SavedSchemas:
        store = cls(Path(path) if path is not None else None)
        try:
            raw = read_json_file(store.path)
        except FileNotFoundError:
            return store
        except UnreadableFileError as exc:
            store._set_aside(exc.reason)
            return store
        entries = raw.get("schemas") if isinstance(raw, dict) else None
        if not isinstance(entries, list):
            store._set_aside('it does not hold {"schemas": [...]}')
            return store
        skipped = 0
        for entry in entries:
            name = entry.get("name") if isinstance(entry, dict) else None
            spec = entry.get("schema") if isinstance(entry, dict) else None
            if (len(store.schemas) >= MAX_SAVED_SCHEMAS or name_problem(name) is not None
                    or not isinstance(spec, str) or spec_problem(spec) is not None or name in store.schemas):
                skipped += 1
                continue
            store.schemas[name] = spec
        if skipped:
            store.load_warning = (f"{skipped} saved JSON schema{'s' if skipped > 1 else ''} in {store.path} "
                                  f"could not be used and {'were' if skipped > 1 else 'was'} left out.")
        return store

    def names(self) -> list[str]:
        return list(self.schemas)

    def name_of(self, spec: str) -> str | None:
        """The name `spec` is saved under (the first), None when it is not saved."""
        return next((name for name, saved in self.schemas.items() if saved == spec), None)

    def save_as(self, name: str, spec: str) -> None:
        """Save (or replace) `spec` under `name` and write the file; SavedSchemaError says why not."""
        name = name.strip() if isinstance(name, str) else name
        problem = name_problem(name) or spec_problem(spec)
        if problem is not None:
            raise SavedSchemaError(problem)
        if name not in self.schemas and len(self.schemas) >= MAX_SAVED_SCHEMAS:
            raise SavedSchemaError(f"At most {MAX_SAVED_SCHEMAS} schemas are kept; delete one first.")
        schemas = dict(self.schemas)
        schemas[name] = spec
        self._write(schemas)

    def delete(self, name: str) -> None:
        if name in self.schemas:
            self._write({k: v for k, v in self.schemas.items() if k != name})

    def _write(self, schemas: dict[str, str]) -> None:
        text = json.dumps({"schemas": [{"name": k, "schema": v} for k, v in schemas.items()]},
                          indent=2, ensure_ascii=False) + "\n"
        if len(text.encode("utf-8")) > MAX_CONFIG_FILE_BYTES:
            raise SavedSchemaError(
                f"The saved schemas would take more than {MAX_CONFIG_FILE_BYTES // 2**20} MiB; delete some first.")
        try:
            make_private_folder(self.path.parent)
            write_text_atomically(self.path, text)
        except OSError as exc:
            raise SavedSchemaError(f"{self.path} could not be written: {exc.strerror or exc}") from None
        self.schemas = schemas

    def _set_aside(self, why: str) -> None:
        bad = set_aside(self.path)
        kept = f" It was kept as {bad}." if bad else ""
        self.load_warning = f"The saved JSON schemas in {self.path} were not used because {why}.{kept}"


def name_problem(name: object) -> str | None:
    if not isinstance(name, str) or not name.strip():
        return "Give the schema a name."
    if len(name) > MAX_NAME_CHARS:
        return f"A schema's name is at most {MAX_NAME_CHARS} characters."
    if any(ord(c) < 32 for c in name):
        return "A schema's name is one line of text."
    return None


def spec_problem(spec: str) -> str | None:
    """Why `spec` is no JSON schema to save (too large, empty, not a JSON object); None when it may be saved.

    The grammar compiler's own check (whether the engine can follow it) runs
    when the schema is applied to a pane, off the GUI thread."""
    try:
        Constraint("json_schema", spec)
    except InvalidConstraint as exc:
        return str(exc)
    try:
        value = json.loads(spec)
    except (json.JSONDecodeError, RecursionError) as exc:
        return f"The schema is not valid JSON: {getattr(exc, 'msg', 'nested too deeply')}."
    if not isinstance(value, dict):
        return "A JSON schema is a JSON object ({...})."
    return None
