"""The documentation (README.md and docs/) against the code it describes."""

from __future__ import annotations

import ast
import inspect
import re
from importlib.util import find_spec
from pathlib import Path

import pytest
from django.core.management.base import BaseCommand
from django.utils.module_loading import import_string

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CHECK_ID = re.compile(r"django_jobs\.[EW]\d{3}")


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_every_system_check_is_documented_and_every_documented_one_exists() -> None:
    in_code = {
        m for path in (ROOT / "django_jobs").rglob("*.py") for m in CHECK_ID.findall(text(path))
    }
    in_docs = {m for page in PAGES for m in CHECK_ID.findall(text(page))}
    reference = text(ROOT / "docs" / "checks.md")
    rows = re.findall(r"^\| `(django_jobs\.[EW]\d{3})` \|", reference, re.MULTILINE)
    assert len(in_code) > 30
    assert in_docs - in_code == set(), "the docs name checks the code does not have"
    assert len(rows) == len(set(rows)), "a check has two rows in docs/checks.md"
    assert set(rows) == in_code, "docs/checks.md must have one row per check the code defines"


def test_every_documented_setting_is_a_setting() -> None:
    from django_jobs import conf

    page = text(ROOT / "docs" / "configuration.md")
    block = page[page.index("DJANGO_JOBS = {") : page.index("\n}\n")]
    documented = set(re.findall(r'^\s+"([A-Z_]+)":', block, re.MULTILINE))
    assert documented == set(conf.DEFAULTS)
    rows = set(re.findall(r"^\| `([A-Z_]+)`", page, re.MULTILINE))
    ops = text(ROOT / "docs" / "operations.md")
    rows |= set(re.findall(r"^\| `([A-Z_]+)`", ops, re.MULTILINE))
    rows |= {"CONCURRENCY", "BATCH", "LEASE", "HEARTBEAT", "GRACE", "POLL_INTERVAL"}
    assert rows == set(conf.DEFAULTS)


def options_of(command: BaseCommand) -> set[str]:
    parser = command.create_parser("manage.py", "command")
    return {option for action in parser._actions for option in action.option_strings}


def test_every_runjobs_option_is_documented() -> None:
    from django_jobs.management.commands.runjobs import Command

    ours = options_of(Command()) - options_of(BaseCommand())
    assert "--no-listen" in ours
    page = text(ROOT / "docs" / "worker.md")
    assert sorted(o for o in ours if f"`{o}" not in page and f"[{o}" not in page) == []


def test_the_readme_shows_the_two_commands_and_links_every_page() -> None:
    readme = text(ROOT / "README.md")
    assert "python3 dev.py demo" in readme
    assert "python3 dev.py test" in readme  # .ci/run runs "the README's test command"
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", readme))
    assert pages - linked == set()


def documented_signature(page: str, call: str) -> tuple[int, list[str]]:
    """Return the positional count and keyword-only names of `call(...)` as page writes it."""
    # The signature opens a line of a code block, or a list item: "- `drain(queue=None, *, ...)`".
    found = re.search(rf"^(?:- `)?{call}\(([^)]*)\)", text(ROOT / "docs" / page), re.MULTILINE)
    assert found, f"no signature of {call} in {page}"
    params = [p.split("=")[0].strip() for p in found[1].replace("\n", " ").split(",")]
    star = params.index("*")
    return star, params[star + 1 :]


@pytest.mark.parametrize(
    ("page", "call", "function"),
    [
        ("enqueue.md", "enqueue_on_commit", "django_jobs.enqueue_on_commit"),
        ("enqueue.md", "enqueue_many", "django_jobs.enqueue_many"),
        ("testing.md", "drain", "django_jobs.testing.drain"),
        ("testing.md", "perform", "django_jobs.testing.perform"),
        ("testing.md", "assert_enqueued", "django_jobs.testing.assert_enqueued"),
    ],
)
def test_documented_signatures_match_the_code(page: str, call: str, function: str) -> None:
    signature = inspect.signature(import_string(function))
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    keyword = [p.name for p in signature.parameters.values() if p.kind == p.KEYWORD_ONLY]
    assert documented_signature(page, call) == (len(positional), keyword)


def test_every_job_option_is_in_the_handlers_table() -> None:
    from django_jobs import job

    options = [
        p.name for p in inspect.signature(job).parameters.values() if p.kind == p.KEYWORD_ONLY
    ]
    page = text(ROOT / "docs" / "handlers.md")
    table = page[page.index("## Options") : page.index("## The job context")]
    rows = re.findall(r"^\| `(\w+)` \|", table, re.MULTILINE)
    assert rows == options


def test_every_public_attribute_of_the_job_context_is_documented() -> None:
    from django_jobs import JobContext

    public = {name for name in dir(JobContext) if not name.startswith("_")} - {"cancel"}
    page = text(ROOT / "docs" / "handlers.md")
    assert sorted(name for name in public if f"`{name}" not in page) == []


# A path of the repository as the pages name it: django_jobs/store/sql.py, tests/test_claim.py.
REPO_PATH = re.compile(r"(?<![\w./-])((?:django_jobs|tests|bench|example_project)/[\w./-]*\w)")


def test_every_path_the_docs_name_exists() -> None:
    named = {(page.name, path) for page in PAGES for path in REPO_PATH.findall(text(page))}
    assert len(named) > 20
    assert sorted((page, path) for page, path in named if not (ROOT / path).exists()) == []


def test_every_source_file_the_architecture_page_names_exists() -> None:
    # It also names files relative to their package (`worker/settle.py`, `runner.py`).
    sources = {str(p.relative_to(ROOT / "django_jobs")) for p in (ROOT / "django_jobs").rglob("*")}
    named = set(re.findall(r"`([\w/]+\.py)`", text(ROOT / "docs" / "architecture.md")))
    assert len(named) > 20
    missing = [
        n
        for n in sorted(named)
        if not (ROOT / n).exists() and not any(s == n or s.endswith(f"/{n}") for s in sources)
    ]
    assert missing == []


def module_constants(module: str) -> set[str]:
    path = ROOT / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    tree = ast.parse(text(path))
    names = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_every_constant_the_docs_name_is_defined_where_they_say() -> None:
    # `store.sql.CLAIM`, `attempts.MAX_TRACEBACK`: defined in that module, not only re-exported
    # there (the reliability page once sent readers to models for MAX_MESSAGE).
    pattern = re.compile(r"`(?:django_jobs\.)?((?:[a-z_]+\.)*[a-z_]+)\.([A-Z][A-Z0-9_]+)`")
    named = {
        (f"django_jobs.{module}", name)
        for page in PAGES
        for module, name in pattern.findall(text(page))
        if module != "django_jobs"
    }
    assert ("django_jobs.store.sql", "CLAIM") in named
    wrong = [(m, n) for m, n in sorted(named) if n not in module_constants(m)]
    assert wrong == []


def test_every_dotted_path_the_docs_name_imports() -> None:
    dotted = {
        path
        for page in PAGES
        for path in re.findall(r"\bdjango_jobs(?:\.[a-z_]+)+\.[A-Z]\w+", text(page))
    }
    assert "django_jobs.backend.JobsBackend" in dotted
    for path in sorted(dotted):
        if path.startswith(("django_jobs.backend.", "django_jobs.tasks.")) and not find_spec(
            "django.tasks"
        ):
            continue  # Django < 6.0: the Tasks backend refuses to import, and says why
        import_string(path)
