"""What components are registered, read without importing them (so without torch).

The names come from the `torchloom.components` entry points. `summaries()` gives each one's
family and the first line of its docstring by reading its module's source (Python's `ast`),
following base classes through the module's own `from X import Y` lines: that is what
`loom components` lists, in a fraction of a second instead of the seconds that importing torch,
torchvision and every component module costs. A class the source reading cannot settle (a
base built at run time, a compiled module) is imported, exactly as before.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

ENTRY_POINT_GROUP = "torchloom.components"
# The family bases (torchloom.core.component) and the family each stands for.
FAMILIES = {
    "Task": "task",
    "Model": "model",
    "Loss": "loss",
    "Statistic": "statistic",
    "Component": "component",
}


def distribution(entry_point: EntryPoint) -> str:
    dist = getattr(entry_point, "dist", None)
    return str(getattr(dist, "name", "?"))


@cache
def claims() -> dict[str, list[EntryPoint]]:
    """Every entry point by component name. Cached: installed packages do not change in a run."""
    found: dict[str, list[EntryPoint]] = {}
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        same = [e for e in found.get(entry_point.name, []) if e.value == entry_point.value]
        if not same:  # the same package seen twice on the path is one claim
            found.setdefault(entry_point.name, []).append(entry_point)
    return found


def clear_cache() -> None:
    """Forget what was found (tests that install a plugin on the fly)."""
    claims.cache_clear()
    _chosen.cache_clear()
    _module_tree.cache_clear()


def registered_entry_points() -> dict[str, EntryPoint]:
    """One entry point per name. A built-in (the torchloom distribution) keeps its name, so a
    plugin can never shadow it; a name two plugins claim is an error when used."""
    return dict(_chosen())


@cache
def _chosen() -> dict[str, EntryPoint]:
    # Cached with claims(): telling each entry point's distribution parses its package's
    # metadata, 15 ms for all of them, and every component of every build asks.
    chosen = {}
    for name, options in claims().items():
        builtin = [e for e in options if distribution(e) == "torchloom"]
        chosen[name] = (builtin or options)[0]
    return chosen


def registered_names() -> list[str]:
    return sorted(registered_entry_points())


# ---- family and one-line description from the source ---------------------------------------
@dataclass(frozen=True)
class Summary:
    family: str
    description: str  # the docstring's first line ('' when there is none)


def summaries() -> dict[str, Summary | None]:
    """Every registered name's summary, read from source; None where the source does not
    settle it (the caller imports that one)."""
    result: dict[str, Summary | None] = {}
    for name, entry_point in registered_entry_points().items():
        module, _, attribute = entry_point.value.partition(":")
        result[name] = _summary(module, attribute, depth=0) if attribute else None
    return result


@cache
def _module_tree(module: str) -> ast.Module | None:
    try:
        spec = importlib.util.find_spec(module)  # imports parent packages only (no torch)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    if origin is None or not origin.endswith(".py"):
        return None
    try:
        return ast.parse(Path(origin).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


def _summary(module: str, name: str, depth: int) -> Summary | None:
    tree = _module_tree(module)
    if tree is None or depth > 8:
        return None
    found = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if found is None:
        origin = _imported_from(tree, module, name)
        return _summary(*origin, depth + 1) if origin else None
    description = _first_line(ast.get_docstring(found))
    if module == "torchloom.core.component" and name in FAMILIES:
        return Summary(FAMILIES[name], description)
    family = _declared_family(found)
    for base in found.bases:
        if not isinstance(base, ast.Name):
            return None  # `module.Base` or a call: left to an import
        origin = _imported_from(tree, module, base.id) or (module, base.id)
        inherited = _summary(*origin, depth + 1)
        if inherited is None:
            return None
        family = family or inherited.family
        description = description or inherited.description
        break  # the first base decides, as a class attribute lookup would
    return Summary(family, description) if family else None


def _imported_from(tree: ast.Module, module: str, name: str) -> tuple[str, str] | None:
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    base = node.module
                    if node.level:  # relative: from the module's package
                        package = module.rsplit(".", node.level)[0]
                        base = f"{package}.{node.module}"
                    return base, alias.name
    return None


def _declared_family(node: ast.ClassDef) -> str:
    for statement in node.body:
        targets = (
            statement.targets
            if isinstance(statement, ast.Assign)
            else [statement.target]
            if isinstance(statement, ast.AnnAssign)
            else []
        )
        value = getattr(statement, "value", None)
        constant = isinstance(value, ast.Constant) and isinstance(value.value, str)
        for target in targets:
            if constant and isinstance(target, ast.Name) and target.id == "family":
                return str(value.value)  # type: ignore[union-attr]
    return ""


def _first_line(doc: str | None) -> str:
    return doc.strip().splitlines()[0] if doc and doc.strip() else ""
