"""`tandem models ...`: search Hugging Face, download, list and remove models
from a terminal.

    tandem models search TEXT [--sort downloads|recent] [--limit N] [--json]
    tandem models files REPO [--json]              the choices and what fits
    tandem models download REPO [--file NAME]      resumes an interrupted download
    tandem models list [--json]
    tandem models remove ID

ui/main.py dispatches `tandem models` here (`main(argv)`). Neither Qt nor
torch is imported at module import; the registry (which estimates memory
with torch) is imported only by the commands that need it. Errors a user
can cause print one sentence to stderr and exit 1; Ctrl+C exits 130 and
keeps what was downloaded for the next run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from app.files import terminal_json, terminal_text
from app.models.errors import ModelError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem models", description="Get and manage Tandem's models.")
    commands = parser.add_subparsers(dest="command", required=True)
    search = commands.add_parser("search", help="search Hugging Face for models Tandem runs")
    search.add_argument("text")
    search.add_argument("--sort", choices=("downloads", "recent", "likes"), default="downloads")
    search.add_argument("--limit", type=int, default=20)
    search.add_argument("--json", action="store_true", help="print JSON")
    files = commands.add_parser("files", help="a repository's files, and which fit this computer")
    files.add_argument("repo")
    files.add_argument("--device", default="auto")
    files.add_argument("--json", action="store_true")
    get = commands.add_parser("download", help="download a model and add it to the list")
    get.add_argument("repo", help="owner/name on Hugging Face")
    get.add_argument("--file", help="the GGUF file to download (default: the recommended one)")
    get.add_argument("--device", default="auto", help="the device the recommendation is for")
    listing = commands.add_parser("list", help="the models Tandem has")
    listing.add_argument("--json", action="store_true")
    remove = commands.add_parser("remove", help="remove a model (a downloaded or imported copy is deleted)")
    remove.add_argument("id")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        return _COMMANDS[args.command](args)
    except ModelError as exc:
        print(terminal_text(f"tandem models: {exc}"), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ntandem models: stopped; run the same command again to continue a download.", file=sys.stderr)
        return 130


def _search(args: argparse.Namespace) -> int:
    from app.models.hub import search_models

    found = search_models(args.text, sort=args.sort, limit=args.limit)
    if args.json:
        print(json.dumps([m.to_json() for m in found], indent=2))
        return 0
    if not found:
        print(f"No model Tandem runs matches '{args.text}'.")
        return 0
    for m in found:
        updated = m.last_modified.date().isoformat() if m.last_modified else "?"
        params = _parameters(m.parameters) if m.parameters else "?"
        print(f"{m.repo_id}  [{', '.join(m.formats)}] {m.architecture}, {params} parameters, "
              f"{m.downloads or 0} downloads, licence {m.license or '?'}, updated {updated}"
              + ("  (gated)" if m.gated else ""))
    return 0


def _files(args: argparse.Namespace) -> int:
    from app.models.hub import assess_choices, repo_files

    listing = repo_files(args.repo)
    fits = assess_choices(listing, args.device)
    if args.json:
        print(json.dumps([
            {"label": f.choice.label, "kind": f.choice.kind, "files": [r.to_json() for r in f.choice.files],
             "size": f.choice.size, "memory_bytes": f.memory_bytes, "memory_free": f.memory_free,
             "disk_free": f.disk_free, "fits": f.fits, "mark": f.mark, "recommended": f.recommended}
            for f in fits
        ], indent=2))
        return 0
    for fit in fits:
        print(fit.describe())
    return 0


def _download(args: argparse.Namespace) -> int:
    from app.models.download import DownloadProgress, download_choice
    from app.models.hub import assess_choices, repo_files
    from app.models.registry import ModelRegistry

    registry = ModelRegistry()
    listing = repo_files(args.repo)
    if args.file:
        choice = listing.choice(args.file)
    else:
        fits = assess_choices(listing, args.device, dest=registry.imports_dir)
        best = next((f for f in fits if f.recommended), None)
        if best is None:
            raise ModelError(
                f"No file of {args.repo} fits this computer:\n  " + "\n  ".join(f.describe() for f in fits)
                + "\nChoose one with --file NAME to download it anyway."
            )
        choice = best.choice
    print(f"Downloading {args.repo}: {choice.label} ({', '.join(f.name for f in choice.files[:3])}"
          f"{', …' if len(choice.files) > 3 else ''})")
    last = [""]

    def show(progress: DownloadProgress) -> None:
        line = f"{progress.fraction * 100:5.1f}%  {progress.detail}"
        if sys.stdout.isatty():
            print("\r" + line.ljust(len(last[0])), end="", flush=True)
        elif progress.stage != "download" and line != last[0]:
            print(line)
        last[0] = line

    entry = download_choice(registry, listing, choice, on_progress=show)
    if sys.stdout.isatty():
        print()
    print(terminal_text(f"Added “{entry.name}” as {entry.id}."))
    return 0


def _list(args: argparse.Namespace) -> int:
    from app.models.registry import ModelRegistry

    registry = ModelRegistry()
    models = registry.models()
    if args.json:
        print(terminal_json(json.dumps([_entry_json(e) for e in models], indent=2, ensure_ascii=False)))
        return 0
    for entry in models:
        where = entry.source.as_posix() if entry.downloaded and entry.source else (str(entry.path) if entry.path else "")
        missing = "" if entry.available() else "  (files missing)"
        print(terminal_text(f"{entry.id}  {entry.name}  [{entry.kind_label}]  {where}{missing}"))
    return 0


def _entry_json(entry: Any) -> dict[str, Any]:
    return {
        "id": entry.id, "name": entry.name, "kind": entry.kind, "label": entry.kind_label,
        "path": str(entry.path) if entry.path else None,
        "source": entry.source.as_posix() if entry.source else None,
        "available": entry.available(),
    }


def _remove(args: argparse.Namespace) -> int:
    from app.models.registry import ModelRegistry

    entry = ModelRegistry().remove(args.id)
    print(terminal_text(f"Removed “{entry.name}”."))
    return 0


def _parameters(count: int) -> str:
    if count >= 1e9:
        return f"{count / 1e9:.1f}B"
    if count >= 1e6:
        return f"{count / 1e6:.0f}M"
    return f"{count / 1e3:.0f}K"


_COMMANDS = {"search": _search, "files": _files, "download": _download, "list": _list, "remove": _remove}


if __name__ == "__main__":
    sys.exit(main())
