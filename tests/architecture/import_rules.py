"""The house rules on imports, read from the source with `ast` (nothing is imported).

`ui -> app -> engine`: engine knows nothing of conversations or Qt, app knows
nothing of widgets, ui uses only the public names of app and engine, and no
two modules import each other at load time. Each rule is a function that
returns the violations it finds in a tree of source files, so a test can show
that it finds a planted one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("engine", "app", "ui")


@dataclass(slots=True, frozen=True)
class ImportSite:
    module: str  # the importing module, dotted ("app.workspace.workspace")
    target: str  # the imported module, dotted
    names: tuple[str, ...]  # names taken from it (`from target import a, b`); () for `import target`
    line: int
    top_level: bool  # runs when the module is imported (not inside a function or TYPE_CHECKING)

    def __str__(self) -> str:
        what = f"from {self.target} import {', '.join(self.names)}" if self.names else f"import {self.target}"
        return f"{self.module}:{self.line}: {what}"


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def import_sites(root: Path, packages: Iterable[str] = PACKAGES) -> Iterator[ImportSite]:
    """Every import statement in the packages' source under `root`."""
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            module = module_name(root, path)
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            yield from _sites(tree, module, path.name == "__init__.py")


def _sites(tree: ast.Module, module: str, is_package: bool) -> Iterator[ImportSite]:
    def visit(nodes: list[ast.stmt], top_level: bool) -> Iterator[ImportSite]:
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield ImportSite(module, alias.name, (), node.lineno, top_level)
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(module, is_package, node.level, node.module)
                yield ImportSite(module, target, tuple(a.name for a in node.names), node.lineno, top_level)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from visit(node.body, False)
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                yield from visit(node.body, False)
                yield from visit(node.orelse, top_level)
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    children = getattr(node, field, None)
                    if isinstance(children, list) and children and isinstance(children[0], (ast.stmt, ast.excepthandler)):
                        for child in children:
                            if isinstance(child, ast.ExceptHandler):
                                yield from visit(child.body, top_level)
                            else:
                                yield from visit([child], top_level)

    yield from visit(tree.body, True)


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


# Which packages a package may not import from (anywhere, lazily included).
FORBIDDEN = {
    "engine": ("app", "ui", "PySide6", "qasync", "shiboken6"),
    "app": ("ui", "PySide6.QtWidgets", "PySide6.QtGui"),
}


def layering_violations(sites: Iterable[ImportSite]) -> list[str]:
    """engine imports nothing from app, ui or Qt; app imports neither ui nor widgets."""
    found = []
    for site in sites:
        for package, forbidden in FORBIDDEN.items():
            if not _within(site.module, package):
                continue
            targets = [site.target] + [f"{site.target}.{n}" for n in site.names]
            if any(_within(t, f) for t in targets for f in forbidden):
                found.append(str(site))
    return found


def private_name_violations(sites: Iterable[ImportSite]) -> list[str]:
    """A layer takes no private name (`_x`) and no private module from a layer
    below it: ui from app or engine, app from engine."""
    found = []
    for site in sites:
        layer = site.module.split(".")[0]
        lower = {"ui": ("app", "engine"), "app": ("engine",)}.get(layer, ())
        if not any(_within(site.target, package) for package in lower):
            continue
        private_module = any(part.startswith("_") for part in site.target.split("."))
        private_names = [n for n in site.names if n.startswith("_")]
        if private_module or private_names:
            found.append(str(site))
    return found


# The engine modules app and ui may import (engine/__init__.py says what each is for);
# every other engine module is the engine's own business, free to change.
PUBLIC_ENGINE_MODULES = frozenset({
    "engine",
    "engine.params",
    "engine.errors",
    "engine.progress",
    "engine.config",
    "engine.reasoning",
    "engine.inspect",
    "engine.model_files",
    "engine.documents",
    "engine.structured",
    "engine.entrypoints.openai.server",
})


def engine_exports(root: Path) -> frozenset[str]:
    """The names `from engine import ...` offers: the keys of engine/__init__.py's `_EXPORTS`."""
    tree = ast.parse((root / "engine" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in targets) and isinstance(node.value, ast.Dict):
            return frozenset(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    return frozenset()


def public_engine_violations(sites: Iterable[ImportSite], exports: frozenset[str]) -> list[str]:
    """app and ui import only the engine's public modules, and from the
    package itself only what it exports (or a public module by name)."""
    found = []
    for site in sites:
        if site.module.split(".")[0] not in ("app", "ui") or not _within(site.target, "engine"):
            continue
        if site.target == "engine":
            ok = all(n in exports or f"engine.{n}" in PUBLIC_ENGINE_MODULES for n in site.names)
        else:
            ok = site.target in PUBLIC_ENGINE_MODULES
        if not ok:
            found.append(str(site))
    return found


# Private attributes ui may read, each of a library, never of app or engine.
PRIVATE_ATTRIBUTES_ALLOWED = {
    ("ui.event_loop", "_run"): "asyncio.Handle._run: how an event loop runs a callback it holds",
}


def private_attribute_violations(root: Path) -> list[str]:
    """ui reads no `_private` attribute of another object (`self._x` and
    `cls._x` are its own business; `os._exit` is public API)."""
    found = []
    for path in sorted((root / "ui").rglob("*.py")):
        module = module_name(root, path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls", "os"):
                continue
            if (module, node.attr) in PRIVATE_ATTRIBUTES_ALLOWED:
                continue
            found.append(f"{module}:{node.lineno}: .{node.attr}")
    return found


def cycles(sites: Iterable[ImportSite]) -> list[list[str]]:
    """Cycles among modules imported at load time (lazy imports inside
    functions and TYPE_CHECKING imports do not run at load, so they may point back)."""
    graph: dict[str, set[str]] = {}
    modules: set[str] = set()
    edges: list[tuple[str, str]] = []
    for site in sites:
        modules.add(site.module)
        if site.top_level:
            edges.append((site.module, site.target))
            edges.extend((site.module, f"{site.target}.{n}") for n in site.names)
    for src, dst in edges:
        # `from pkg import name` is an edge to pkg.name only when that is a module.
        if dst in modules and dst != src:
            graph.setdefault(src, set()).add(dst)
    found: list[list[str]] = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    counter = [0]

    def strongconnect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(modules):
        if v not in index:
            strongconnect(v)
    return found
