"""Imports run one way, down the layers of LAYERS (docs/architecture.md draws them).

Read from the source (ast), not by importing: every module of django_jobs, its
imports at module level, inside functions and under ``if TYPE_CHECKING:`` (an
annotation's import is an arrow too: mypy follows it). A module imports its own
layer or lower ones, never a higher one, not even lazily in a function; and the
modules' imports form no circle. docs/architecture.md draws the same table.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "django_jobs"

# Lowest first. A module's layer is that of its longest prefix here ("django_jobs.admin"
# covers django_jobs.admin.jobs); every module must have one.
LAYERS: list[tuple[str, set[str]]] = [
    # Import nothing of django_jobs but each other.
    ("leaves", {"limits", "exceptions", "signals"}),
    # The DJANGO_JOBS settings and what the database connections need from them.
    ("configuration", {"conf", "routers", "sqlite"}),
    # Pure concepts: handlers, payloads, an attempt's errors, the context, schedules'
    # specifications, the lifecycle's decisions, the values that cross the layers.
    # No models, no database.
    (
        "concepts",
        {
            "payloads",
            "attempts",
            "rows",
            "context",
            "registry",
            "schedules",
            "lifecycle",
            "flow",
            "tracing",
            "progress",
            "encryption",
            "uniqueness",
        },
    ),
    # The tables and every statement that writes them (the store imports no registry:
    # its callers hand it what it needs of the handlers).
    ("store", {"managers", "fleet", "models", "store", "schema", "migrations", "tagging"}),
    # What runs over the store: enqueue, the worker, and the operations' reads and writes.
    ("worker and enqueue", {"api", "worker", "control", "retention", "status", "dashboard"}),
    # What Django, users and operators call: the package's public names, the app config,
    # system checks, admin, commands, the Tasks backend, metrics, test helpers.
    (
        "entry points",
        {
            "",  # django_jobs/__init__.py: the public API, re-exported
            "apps",
            "checks",
            "admin",
            "management",
            "tasks",
            "backend",
            "metrics",
            "testing",
            "pytest_plugin",
        },
    ),
]
RANK = {name: rank for rank, (_, names) in enumerate(LAYERS) for name in names}
LAYER_NAMES = [name for name, _ in LAYERS]

# Imports that go up, each with its reason. Keep this short: the answer to a new
# upward import is almost always to move the code, or to connect it from apps.ready().
ALLOWED_UP: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Import:
    source: str  # "django_jobs.models"
    target: str  # a module of django_jobs, or "django_jobs" for the package's own names
    line: int
    lazy: bool  # inside a function
    typing: bool = False  # under `if TYPE_CHECKING:` (annotations only)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int:
    parts = module.removeprefix("django_jobs").removeprefix(".").split(".")
    for end in range(len(parts), -1, -1):
        rank = RANK.get(".".join(parts[:end]))
        if rank is not None and (end or module == "django_jobs"):
            return rank
    raise AssertionError(f"{module} has no layer: add it to LAYERS in tests/test_layers.py")


def _type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(module: str) -> Iterator[Import]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def walk(node: ast.AST, lazy: bool, typing: bool = False) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                # Annotations only: these never run, but mypy follows them (a circle there
                # is a circle in the design), so they count as module-level imports.
                yield from (i for c in child.body for i in walk(ast.Module([c], []), lazy, True))
                yield from (i for c in child.orelse for i in walk(ast.Module([c], []), lazy))
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.partition(".")[0] == "django_jobs":
                        yield Import(module, resolve(alias.name), child.lineno, lazy, typing)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join([*anchor, *([child.module] if child.module else [])])
                if base.partition(".")[0] != "django_jobs":
                    continue
                for alias in child.names:
                    # `from django_jobs import conf` imports the module conf; `from
                    # django_jobs import job` takes a name of the package's __init__.
                    name = f"{base}.{alias.name}"
                    target = name if name in MODULES else resolve(base)
                    yield Import(module, target, child.lineno, lazy, typing)
            else:
                inner = lazy or isinstance(
                    child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
                )
                yield from walk(child, inner, typing)

    yield from walk(ast.parse(path.read_text(encoding="utf-8")), False)


def resolve(name: str) -> str:
    while name not in MODULES:
        name, dot, _ = name.rpartition(".")
        assert dot, f"no module of django_jobs is called {name}"
    return name


IMPORTS = [i for module in MODULES for i in imports_of(module) if i.target != i.source]


def test_the_walk_sees_imports_at_every_depth() -> None:
    found = {(i.source, i.target, i.lazy) for i in IMPORTS}
    assert ("django_jobs.store.postgres", "django_jobs.conf", False) in found
    assert ("django_jobs.apps", "django_jobs.registry", True) in found  # inside ready()
    assert ("django_jobs.admin.jobs", "django_jobs.admin.base", False) in found  # relative
    typing = {(i.source, i.target) for i in IMPORTS if i.typing}
    assert ("django_jobs.registry", "django_jobs.rows") in typing  # under TYPE_CHECKING
    assert len(MODULES) > 60


def test_every_module_has_a_layer_and_every_layer_entry_is_a_module() -> None:
    for module in MODULES:
        layer_of(module)
    named = {f"django_jobs.{name}".rstrip(".") for _, names in LAYERS for name in names}
    assert sorted(named - set(MODULES)) == []


def test_imports_never_go_up_a_layer() -> None:
    upward = [
        f"{i.source}:{i.line} ({LAYER_NAMES[layer_of(i.source)]}) imports {i.target} "
        f"({LAYER_NAMES[layer_of(i.target)]}){' in a function' if i.lazy else ''}"
        for i in IMPORTS
        if layer_of(i.target) > layer_of(i.source) and (i.source, i.target) not in ALLOWED_UP
    ]
    assert upward == []


def test_no_module_takes_names_from_the_package_init() -> None:
    # django_jobs/__init__.py re-exports for users; inside the package that would be a
    # circle through everything it imports (only its own submodules may use it: none do).
    users = sorted({f"{i.source}:{i.line}" for i in IMPORTS if i.target == "django_jobs"})
    assert users == []


def cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """Return one circle per strongly connected component of more than one module."""
    graph: dict[str, set[str]] = {}
    for source, target in edges:
        graph.setdefault(source, set()).add(target)
    found, done = [], set()
    for start in sorted(graph):
        path, on_path = [start], {start}
        stack = [iter(sorted(graph.get(start, ())))]
        while stack:
            step = next(stack[-1], None)
            if step is None:
                stack.pop()
                on_path.discard(path.pop())
                continue
            if step in on_path:
                circle = path[path.index(step) :]
                if frozenset(circle) not in done:
                    done.add(frozenset(circle))
                    found.append([*circle, step])
            elif step not in done:
                path.append(step)
                on_path.add(step)
                stack.append(iter(sorted(graph.get(step, ()))))
        done.add(start)
    return found


@pytest.mark.parametrize("lazy", [False, True], ids=["module level", "with functions"])
def test_the_imports_form_no_circle(lazy: bool) -> None:
    edges = {(i.source, i.target) for i in IMPORTS if lazy or not i.lazy}
    assert [" -> ".join(circle) for circle in cycles(edges)] == []


def test_the_circle_finder_finds_circles() -> None:
    assert cycles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [["a", "b", "c", "a"]]
    assert cycles({("a", "b"), ("b", "c"), ("a", "c")}) == []


def test_the_architecture_page_shows_these_layers() -> None:
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| ([a-z ]+) \| (`.*`) \|$", page, re.MULTILINE)
    shown = {layer: {m.strip("`") for m in modules.split(", ")} for layer, modules in rows}
    wanted = {layer: {name or "__init__" for name in names} for layer, names in LAYERS}
    assert shown == wanted


# The test helpers drive the worker through its public seam (django_jobs.worker.inline),
# so that a change to the worker's inside cannot break the users' tests.
HELPERS = ["testing.py", "pytest_plugin.py"]


def private_uses(source: str) -> list[str]:
    """Return the private names of other modules that source imports or reaches into.

    `from m import _x`, `import m._x`, and `obj._x` on anything but `self`/`cls`
    (`super()._x` too: an override of another module's private method).
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".") + [alias.name for alias in node.names]
            found += [f"line {node.lineno}: import {p}" for p in parts if _private(p)]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                found += [f"line {node.lineno}: import {p}" for p in parts if _private(p)]
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                found.append(f"line {node.lineno}: ._{node.attr.lstrip('_')}")
    return sorted(found, key=lambda text: int(text.split()[1].rstrip(":")))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@pytest.mark.parametrize("helper", HELPERS)
def test_the_test_helpers_use_no_private_name_of_another_module(helper: str) -> None:
    assert private_uses((PACKAGE / helper).read_text(encoding="utf-8")) == []


def test_the_private_name_finder_finds_them() -> None:
    source = (
        "from django_jobs.api import _prepare\n"
        "import django_jobs._inside\n"
        "from django_jobs.worker import Worker\n"
        "class W(Worker):\n"
        "    def _db(self):\n"
        "        self._own = 1\n"
        "        return super()._db()\n"
        "def f(worker):\n"
        "    return worker._inflight, worker.__class__\n"
    )
    assert private_uses(source) == [
        "line 1: import _prepare",
        "line 2: import _inside",
        "line 7: ._db",
        "line 9: ._inflight",
    ]
