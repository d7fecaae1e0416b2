"""Secrets (remote servers' API keys, the local server's key): in the OS keyring, else a private file.

Never in the chat store: chats.sqlite3 is a file users copy, back up and
attach to bug reports. A secret is a short text under an id (`remote-pane/<uuid>`,
`SERVER_API_KEY`); the chat store keeps only the id.

Where secrets go, chosen once per process by `default_secrets()`:

- the operating system's keyring (macOS Keychain, Windows Credential
  Locker, the Secret Service on Linux) through the `keyring` package, when
  it is installed and has a usable backend (not its "fail" or "null" one);
- otherwise `secrets.json` in the config folder, mode 0600 in a 0700 folder,
  written atomically. A keyring that fails at run time (locked, D-Bus gone)
  falls back to the same file for that secret, so a key is never lost.

`TANDEM_SECRETS=file` forces the file (headless machines, tests).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from app.errors import AppError
from app.files import make_private_file, make_private_folder, write_text_atomically

log = logging.getLogger(__name__)

# The keyring's "service" name: how the secrets show in the OS's password manager.
KEYRING_SERVICE = "Tandem"
SECRETS_FILE_NAME = "secrets.json"
# The id of the window's local server's API key.
SERVER_API_KEY = "server-api-key"
# The ids of remote panes' API keys start with this.
REMOTE_PANE_PREFIX = "remote-pane/"
_FILE_FORMAT = "tandem-secrets"


class SecretStoreError(AppError):
    """A secret could not be saved or read; the message says where and why."""


class Secrets(Protocol):
    """Where secrets are kept: text values under ids."""

    def get(self, secret_id: str) -> str | None: ...

    def set(self, secret_id: str, value: str) -> None: ...

    def delete(self, secret_id: str) -> None: ...

    @property
    def where(self) -> str: ...


@dataclass(slots=True)
class FileSecrets:
    """Secrets in one JSON file, mode 0600, in a 0700 folder (Tandem's config folder)."""

    path: Path
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def where(self) -> str:
        return str(self.path)

    def get(self, secret_id: str) -> str | None:
        with self._lock:
            value = self._read().get(secret_id)
        return value if isinstance(value, str) else None

    def set(self, secret_id: str, value: str) -> None:
        with self._lock:
            values = self._read()
            if values.get(secret_id) == value:
                return
            values[secret_id] = value
            self._write(values)

    def delete(self, secret_id: str) -> None:
        with self._lock:
            values = self._read()
            if values.pop(secret_id, None) is not None:
                self._write(values)

    def _read(self) -> dict[str, Any]:
        make_private_file(self.path)  # one Tandem wrote looser, or a user copied in
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            raise SecretStoreError(f"The secrets file {self.path} could not be read ({exc}).") from None
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            data = None
        secrets = data.get("secrets") if isinstance(data, dict) else None
        if not isinstance(secrets, dict):
            raise SecretStoreError(
                f"The secrets file {self.path} is damaged (it is not Tandem's secrets file). "
                "Move it away; the remote panes will then ask for their API keys again."
            )
        return {k: v for k, v in secrets.items() if isinstance(k, str) and isinstance(v, str)}

    def _write(self, values: dict[str, str]) -> None:
        text = json.dumps({"format": _FILE_FORMAT, "version": 1, "secrets": values}, indent=2) + "\n"
        try:
            make_private_folder(self.path.parent)
            write_text_atomically(self.path, text)  # 0600, never through a link
        except OSError as exc:
            raise SecretStoreError(
                f"The secrets file {self.path} could not be written ({exc.strerror or exc})."
            ) from None


@dataclass(slots=True)
class KeyringSecrets:
    """Secrets in the OS keyring; the file when the keyring fails for one of them."""

    backend: Any  # a keyring.backend.KeyringBackend
    fallback: FileSecrets

    @property
    def where(self) -> str:
        return f"the system keyring ({type(self.backend).__name__})"

    def get(self, secret_id: str) -> str | None:
        try:
            value = self.backend.get_password(KEYRING_SERVICE, secret_id)
        except Exception as exc:  # any backend error: locked, D-Bus gone, access refused
            log.warning("the keyring could not be read (%s); trying the secrets file", exc)
            value = None
        if value is not None:
            return value
        return self.fallback.get(secret_id)

    def set(self, secret_id: str, value: str) -> None:
        try:
            self.backend.set_password(KEYRING_SERVICE, secret_id, value)
        except Exception as exc:
            log.warning("the keyring could not save a secret (%s); using %s", exc, self.fallback.path)
            self.fallback.set(secret_id, value)
            return
        # A copy kept in the file while the keyring was failing is stale now.
        if self.fallback.path.exists():
            self.fallback.delete(secret_id)

    def delete(self, secret_id: str) -> None:
        try:
            self.backend.delete_password(KEYRING_SERVICE, secret_id)
        except Exception:  # not there (PasswordDeleteError) or the keyring failing: nothing to keep
            pass
        if self.fallback.path.exists():
            self.fallback.delete(secret_id)


def usable_keyring() -> Any | None:
    """The keyring package's backend when it is installed and not its fail/null backend; else None."""
    try:
        import keyring
        from keyring.backends import fail
    except Exception:  # not installed, or broken on this system
        return None
    try:
        backend = keyring.get_keyring()
    except Exception:
        return None
    if isinstance(backend, fail.Keyring):
        return None
    try:
        from keyring.backends import null

        if isinstance(backend, null.Keyring):
            return None
    except ImportError:
        pass
    # A chainer with nothing usable inside reports priority 0 or less.
    try:
        if backend.priority <= 0:
            return None
    except Exception:
        return None
    return backend


def secrets_file_path() -> Path:
    from app.settings import config_dir  # lazily: app.settings imports the sampler (torch)

    return config_dir() / SECRETS_FILE_NAME


_default: Secrets | None = None
_default_key: tuple[str, str] | None = None
_default_lock = threading.Lock()


def default_secrets() -> Secrets:
    """The keyring (with the file as its fallback) or the file alone; see the module docstring.

    Chosen again when $TANDEM_CONFIG_DIR or $TANDEM_SECRETS change (tests point them elsewhere)."""
    global _default, _default_key
    file_path = secrets_file_path()
    choice = os.environ.get("TANDEM_SECRETS", "").strip().lower()
    key = (str(file_path), choice)
    with _default_lock:
        if _default is None or _default_key != key:
            fallback = FileSecrets(file_path)
            backend = None if choice == "file" else usable_keyring()
            _default = fallback if backend is None else KeyringSecrets(backend, fallback)
            _default_key = key
        return _default


def new_remote_key_id() -> str:
    """A fresh id for a remote pane's API key."""
    import uuid

    return REMOTE_PANE_PREFIX + uuid.uuid4().hex
