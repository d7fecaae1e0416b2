"""Hand-edited (or planted) settings.json and models.json: any content, a FIFO or a link
to /dev/zero in their place, a file far too big. Each is a warning, the defaults (or the
valid part) are used, and the file is kept aside as `<name>.bad`; nothing hangs, nothing
raises, `tandem models list` still lists."""

from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import app.files
from app.files import MAX_CONFIG_FILE_BYTES
from app.models.registry import DEFAULT_MODEL_ID, ModelRegistry
from app.settings import Settings
from engine.params import SamplingParams

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "config"
    folder.mkdir()
    monkeypatch.setenv("TANDEM_CONFIG_DIR", str(folder))
    return folder


# (the file's bytes, what the warning says)
HOSTILE = {
    "5,000-digit integer": (b'{"threads": ' + b"7" * 5000 + b"}", "a number of more than 4300 digits"),
    "lists nested 100,000 deep": (b'{"ui_state": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    "objects nested 100,000 deep": (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "nested too deeply"),
    "lone surrogate": (b'{"default_system_prompt": "\\ud800", "models": []}', "lone surrogate"),
    "not UTF-8": (b'\xff\xfe{"theme": "dark"}', "not a text file"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_settings_are_a_warning_and_the_file_is_kept(case: str, config_dir: Path) -> None:
    content, needle = HOSTILE[case]
    path = config_dir / "settings.json"
    path.write_bytes(content)
    settings = Settings.load()
    assert settings == Settings()
    assert settings.load_warning and needle in settings.load_warning and "settings.json.bad" in settings.load_warning
    assert len(settings.load_warning) < 500
    assert (config_dir / "settings.json.bad").read_bytes() == content and not path.exists()
    settings.save()  # the defaults write and load back cleanly
    assert Settings.load().load_warning is None


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_model_list_is_a_warning_and_the_file_is_kept(case: str, tmp_path: Path) -> None:
    content, needle = HOSTILE[case]
    path = tmp_path / "models.json"
    path.write_bytes(content)
    registry = ModelRegistry(path)
    assert [e.id for e in registry.models()] == [DEFAULT_MODEL_ID]
    assert registry.load_warning and needle in registry.load_warning and "models.json.bad" in registry.load_warning
    assert (tmp_path / "models.json.bad").read_bytes() == content


def test_values_of_the_wrong_type_fall_back_one_by_one_with_a_short_warning(config_dir: Path) -> None:
    big = "y" * 1_000_000  # a warning quotes a value, never a megabyte of it
    (config_dir / "settings.json").write_text(json.dumps({
        "theme": "dark",
        "threads": "four",
        "model": 123,
        "device": {"x": big},
        "page_size": 10**4000,
        "ui_state": [[[[[[big]]]]]],
        "default_params": {"temperature": [1], "seed": "x", "top_k": 20, "stop": big},
    }), encoding="utf-8")
    settings = Settings.load()
    assert settings.theme == "dark" and settings.threads is None and settings.model == "default"
    assert settings.device == "auto" and settings.ui_state == {}
    assert settings.default_params == SamplingParams(top_k=20)
    warning = settings.load_warning or ""
    for key in ("threads", "model", "device", "page_size", "ui_state", "temperature", "seed"):
        assert key in warning, (key, warning)
    assert len(warning) < 3000
    assert (config_dir / "settings.json.bad").exists()


def test_a_file_past_the_byte_cap_is_not_read(
    config_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app.files, "MAX_CONFIG_FILE_BYTES", 100)
    text = json.dumps({"theme": "dark", "default_system_prompt": "x" * 100})
    (config_dir / "settings.json").write_text(text, encoding="utf-8")
    settings = Settings.load()
    assert settings.theme == "system" and "more than the 100 bytes" in (settings.load_warning or "")
    (tmp_path / "models.json").write_text(json.dumps({"version": 1, "models": [], "pad": "x" * 100}), "utf-8")
    registry = ModelRegistry(tmp_path / "models.json")
    assert "more than the 100 bytes" in (registry.load_warning or "")


CHILD = """
import sys
from app.models.registry import ModelRegistry
from app.settings import Settings
for kind, path in zip(sys.argv[1::2], sys.argv[2::2]):
    warning = Settings.load(path).load_warning if kind == "settings" else ModelRegistry(path).load_warning
    print(kind, warning, flush=True)
"""


def test_a_fifo_a_link_to_dev_zero_or_a_giant_is_kept_aside_unread(tmp_path: Path) -> None:
    """In a child under a memory limit: a FIFO would block the start forever, /dev/zero
    would grow until memory runs out, a sparse file past the real cap would be read whole."""
    cases: list[tuple[str, Path, str]] = []
    for kind in ("settings", "models"):
        folder = tmp_path / kind
        folder.mkdir()
        fifo, zero, giant = folder / "fifo.json", folder / "zero.json", folder / "giant.json"
        os.mkfifo(fifo)
        zero.symlink_to("/dev/zero")
        with open(giant, "wb") as file:
            file.truncate(MAX_CONFIG_FILE_BYTES + 1)
        cases += [(kind, fifo, "a named pipe (FIFO), not a regular file"), (kind, zero, "a device, not a regular file"),
                  (kind, giant, "more than the 4.0 MiB")]
    probe = "import app.settings, app.models.registry\nprint(next(l for l in open('/proc/self/status') if l.startswith('VmPeak')))"
    baseline = int(subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                                  check=True).stdout.split()[1]) * 1024
    limit = baseline + 128 * 2**20

    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    args = [str(x) for kind, path, _ in cases for x in (kind, path)]
    done = subprocess.run([sys.executable, "-c", CHILD, *args], cwd=REPO, capture_output=True, text=True, timeout=60,
                          preexec_fn=cap_memory, env=dict(os.environ, TANDEM_CONFIG_DIR=str(tmp_path / "config")))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == len(cases), done.stdout
    for line, (kind, path, needle) in zip(lines, cases):
        assert line.startswith(kind) and needle in line and f"{path.name}.bad" in line, line
        assert not os.path.lexists(path)
    # Kept aside as they were, not deleted, not followed.
    kept = {p.name: os.lstat(p).st_mode for p in tmp_path.glob("*/*.bad")}
    assert stat.S_ISFIFO(kept["fifo.json.bad"]) and stat.S_ISLNK(kept["zero.json.bad"])
    assert os.readlink(tmp_path / "settings" / "zero.json.bad") == "/dev/zero"


def test_tandem_models_list_survives_a_5000_digit_integer(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "models.json").write_text('{"version": 1, "models": [], "default": {"max_context": '
                                      + "9" * 5000 + "}}", encoding="utf-8")
    script = "import sys; from ui.main import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", script, "models", "list"], cwd=REPO, capture_output=True, text=True, timeout=60,
        env=dict(os.environ, TANDEM_DATA_DIR=str(data), TANDEM_LOG_DIR=str(tmp_path / "logs")),
    )
    assert done.returncode == 0 and done.stdout.startswith(f"{DEFAULT_MODEL_ID}  "), (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and "more than 4300 digits" in done.stderr
    assert (data / "models.json.bad").exists()


def test_tandem_models_prints_a_models_name_without_steering_the_terminal(tmp_path: Path) -> None:
    # A model's name comes from its file (GGUF general.name), made by a stranger.
    data = tmp_path / "data"
    data.mkdir()
    name = "evil\x1b]0;pwned\x07\x1b[2J\u202egguf.exe"
    entry = {"id": "evil", "name": name, "kind": "folder", "path": str(tmp_path / "evil")}
    (data / "models.json").write_text(json.dumps({"version": 1, "models": [entry]}), encoding="utf-8")
    script = "import sys; from ui.main import main; sys.exit(main(sys.argv[1:]))"
    env = dict(os.environ, TANDEM_DATA_DIR=str(data), TANDEM_LOG_DIR=str(tmp_path / "logs"))
    for args in (["models", "list"], ["models", "list", "--json"]):
        done = subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, capture_output=True, text=True,
                              timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        assert "evil" in done.stdout
        assert not any(c in done.stdout for c in "\x1b\x07\u202e"), done.stdout
    assert json.loads(done.stdout)[-1]["name"] == name  # still the same JSON
