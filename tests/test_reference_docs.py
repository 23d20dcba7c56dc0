"""The reference pages against the code: docs/commands.md, docs/api.md, docs/monitoring.md.

Each page is written by hand; these tests fail when the code gains an option, a public
name, a parameter or a metric the page does not describe (or the page one the code lacks).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
from enum import Enum
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest
from django.core.management.base import BaseCommand

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """Return the text under `heading` (a whole line) up to the next heading of its level."""
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    following = re.search(rf"^{level} ", text[start:], re.MULTILINE)
    return text[start : start + following.start()] if following else text[start:]


# ---- docs/commands.md ---------------------------------------------------------------

COMMANDS = ["runjobs", "jobs", "replayjobs", "prunejobs"]
DJANGO_OPTIONS = {
    option
    for action in BaseCommand().create_parser("manage.py", "command")._actions
    for option in action.option_strings
}


def parser_arguments(parser: argparse.ArgumentParser) -> set[str]:
    """Return the options (and the metavars of the positional arguments) parser takes."""
    found = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
            continue
        if action.option_strings:
            found |= set(action.option_strings) - DJANGO_OPTIONS
        else:
            found.add(str(action.metavar or action.dest.upper()))
    return found


def documented_arguments(text: str) -> set[str]:
    """Return what the first column of the section's tables names: `--queue NAME`, `-q NAME`."""
    found = set()
    for cell in re.findall(r"^\| (`[^|]*`) \|", text, re.MULTILINE):
        found |= {chunk.split()[0] for chunk in re.findall(r"`([^`]+)`", cell)}
    return found


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_the_commands_page_has_a_section_per_command_of_the_app() -> None:
    shipped = {p.stem for p in (ROOT / "django_jobs/management/commands").glob("[!_]*.py")}
    assert shipped == set(COMMANDS)
    headings = re.findall(r"^## (\w+)$", page("commands.md"), re.MULTILINE)
    assert headings == COMMANDS


@pytest.mark.parametrize("name", COMMANDS)
def test_the_commands_page_lists_every_option_of_each_command(name: str) -> None:
    command = import_module(f"django_jobs.management.commands.{name}").Command()
    parser = command.create_parser("manage.py", name)
    text = section(page("commands.md"), f"## {name}")
    actions = subparsers(parser)
    if not actions:
        assert parser_arguments(parser), name
        assert documented_arguments(text) == parser_arguments(parser)
        return
    # jobs: one ### section per action, each listing that action's arguments.
    assert re.findall(rf"^### {name} (\w+)$", text, re.MULTILINE) == list(actions)
    for action, sub in actions.items():
        described = section(text, f"### {name} {action}")
        assert documented_arguments(described) == parser_arguments(sub), action
        assert f"python manage.py {name} {action}" in described, action


def test_documented_arguments_reads_every_cell_of_the_first_column() -> None:
    table = "| option | x |\n|---|---|\n| `--queue NAME`, `-q NAME` | y |\n| `QUEUE` | z |\n"
    assert documented_arguments(table) == {"--queue", "-q", "QUEUE"}


# ---- docs/api.md --------------------------------------------------------------------


def public_names() -> dict[str, Any]:
    import django_jobs
    import django_jobs.testing

    names = {name: getattr(django_jobs, name) for name in django_jobs.__all__}
    names |= {name: getattr(django_jobs.testing, name) for name in django_jobs.testing.__all__}
    return names


def documented_block(name: str) -> str:
    """Return the first code block under `### name` in docs/api.md."""
    text = section(page("api.md"), f"### {name}")
    found = re.search(r"```python\n(.*?)\n```", text, re.DOTALL)
    assert found, f"docs/api.md: no code block under ### {name}"
    return found[1]


def test_the_api_page_documents_exactly_the_public_names() -> None:
    headings = re.findall(r"^### (\S+)$", page("api.md"), re.MULTILINE)
    assert len(headings) == len(set(headings))
    assert sorted(headings) == sorted(public_names())


def literal(node: ast.expr | None) -> object:
    return ast.literal_eval(node) if node is not None else inspect.Parameter.empty


def parameters_of(code: str) -> list[tuple[str, str, object]]:
    """Return (name, kind, default) of each parameter of a documented call `f(a, *, b=1)`."""
    tree = ast.parse(f"def {code.strip()}: pass")
    function = tree.body[0]
    assert isinstance(function, ast.FunctionDef)
    args = function.args
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    found = [
        (a.arg, "POSITIONAL_ONLY" if a in args.posonlyargs else "POSITIONAL_OR_KEYWORD", literal(d))
        for a, d in zip(positional, defaults, strict=True)
    ]
    if args.vararg:
        found.append((args.vararg.arg, "VAR_POSITIONAL", inspect.Parameter.empty))
    found += [
        (a.arg, "KEYWORD_ONLY", literal(d))
        for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    ]
    if args.kwarg:
        found.append((args.kwarg.arg, "VAR_KEYWORD", inspect.Parameter.empty))
    return found


def parameters_in_code(obj: Any) -> list[tuple[str, str, object]]:
    def default(p: inspect.Parameter) -> object:
        # A default the page cannot write as a literal (a module constant) is shown by value.
        return p.default

    return [(p.name, p.kind.name, default(p)) for p in inspect.signature(obj).parameters.values()]


def fields_in_code(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")]
    if issubclass(cls, Enum):
        return list(cls.__members__)
    return []


@pytest.mark.parametrize("name", sorted(public_names()))
def test_each_documented_signature_is_the_codes(name: str) -> None:
    obj = public_names()[name]
    code = documented_block(name)
    if code.startswith("class "):
        assert isinstance(obj, type), name
        tree = ast.parse(code if not code.endswith(":") else f"{code}\n    pass").body[0]
        assert isinstance(tree, ast.ClassDef) and tree.name == name
        bases = [b.id for b in tree.bases if isinstance(b, ast.Name)]
        assert bases == [b.__name__ for b in obj.__bases__ if b is not object], name
        body = [n for n in tree.body if not isinstance(n, ast.Pass)]
        fields = [
            n.target.id if isinstance(n, ast.AnnAssign) else n.targets[0].id  # type: ignore[attr-defined]
            for n in body
        ]
        assert fields == fields_in_code(obj), name
        if issubclass(obj, Enum):
            values = [ast.literal_eval(n.value) for n in body if isinstance(n, ast.Assign)]
            assert values == [member.value for member in obj], name
        return
    if not callable(obj):  # a constant: NAME = value
        target, value = (part.strip() for part in code.split("=", 1))
        assert (target, ast.literal_eval(value)) == (name, obj)
        return
    assert code.startswith(f"{name}("), code
    assert parameters_of(code) == parameters_in_code(obj)


def test_parameters_of_reads_each_kind() -> None:
    empty = inspect.Parameter.empty
    assert parameters_of("f(a, /, b=1, *c, d, e='x', **f)") == [
        ("a", "POSITIONAL_ONLY", empty),
        ("b", "POSITIONAL_OR_KEYWORD", 1),
        ("c", "VAR_POSITIONAL", empty),
        ("d", "KEYWORD_ONLY", empty),
        ("e", "KEYWORD_ONLY", "x"),
        ("f", "VAR_KEYWORD", empty),
    ]


# ---- docs/monitoring.md -------------------------------------------------------------

METRIC_ROW = re.compile(
    r"^\| `(django_jobs_[a-z_]+)` \| (\w+) \| [^|]* \| ([^|]+) \|$", re.MULTILINE
)


@pytest.mark.django_db
def test_the_monitoring_page_lists_exactly_the_metrics_a_scrape_exports() -> None:
    pytest.importorskip("prometheus_client")
    from django_jobs import metrics, signals

    metrics.install()
    try:
        # What a scrape serves: the collector's families, and the process's enqueue counter.
        families = [*metrics.JobsCollector().collect(), *metrics._process_registry.collect()]
    finally:  # install() connects a receiver: leave no receiver to the tests after this one
        signals.job_enqueued.disconnect(dispatch_uid="django_jobs.metrics.enqueued")
    exported = {f.name: f.type for f in families}
    # And every name the module spells, should a family be yielded only on some data.
    spelled = set(
        re.findall(r'"(django_jobs_[a-z_]+)"', (ROOT / "django_jobs/metrics.py").read_text())
    )
    assert set(exported) == spelled
    rows = {
        name: (kind, meaning) for name, kind, meaning in METRIC_ROW.findall(page("monitoring.md"))
    }
    # prometheus_client adds _total to a counter's name; the page writes what a scrape shows.
    documented = {name.removesuffix("_total"): kind for name, (kind, _) in rows.items()}
    assert documented == exported
    assert all(len(meaning.split()) > 3 for _, meaning in rows.values())
    counters = {name for name, kind in exported.items() if kind == "counter"}
    assert {n for n in rows if n.endswith("_total")} == {f"{n}_total" for n in counters}
