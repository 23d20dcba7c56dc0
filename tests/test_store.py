"""The store's shape: one engine per database alias, the index, and the size rules.

Read from the source where a rule is about the code (ast), and from a real database
where it is about which engine runs.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.db import connection

from django_jobs.store import JobStore
from django_jobs.store.engine import engine
from django_jobs.store.mysql import MySQL
from django_jobs.store.portable import Portable
from django_jobs.store.postgres import Postgres
from tests.conftest import ENGINE

PACKAGE = Path(__file__).resolve().parent.parent / "django_jobs"
STORE = PACKAGE / "store"
# The modules that may ask which database they talk to: the engines and their chooser.
ENGINE_MODULES = {"engine.py", "postgres.py", "portable.py", "mysql.py", "sql.py"}


def test_the_engine_is_chosen_once_per_alias_by_its_vendor() -> None:
    chosen = engine(connection.alias)
    assert chosen is engine(connection.alias)  # cached: no choice per call
    wanted = {"postgresql": Postgres, "mysql": MySQL, "sqlite": Portable}[connection.vendor]
    assert type(chosen) is wanted, ENGINE


@pytest.mark.parametrize("path", sorted(STORE.glob("*.py")), ids=lambda p: p.name)
def test_no_function_of_the_store_is_over_80_lines(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    long = [
        f"{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > 80
    ]
    assert long == []


def test_only_the_engine_modules_ask_which_database_they_talk_to() -> None:
    asking = re.compile(r"\.vendor\b|_is_postgres")
    found = [
        f"{path.name}:{number}"
        for path in sorted(STORE.glob("*.py"))
        if path.name not in ENGINE_MODULES
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if asking.search(line)
    ]
    found += [
        f"models.py:{n}"
        for n, line in enumerate((PACKAGE / "models.py").read_text().splitlines(), 1)
        if "_is_postgres" in line or re.search(r"vendor\s*[!=]=", line)
    ]
    assert found == []


# Outside the store, the modules that still test a database's vendor, and why. What a
# feature may do on an engine is asked of the store (JobStore(alias).enforces_limits,
# .estimates_counts, .listens, .vacuums, .claims_safely(), .refused(exc),
# .transaction_aborted(), .clock()), never of the vendor.
VENDOR_ALLOWED = {
    # One engine's own settings: SQLite's connection options and their check.
    "sqlite.py",
    "checks/database.py",
    # The check that drops Django's partial-index warnings where MySQL stands in for them.
    "models.py",
}


def test_outside_the_store_features_ask_the_store_not_the_vendor() -> None:
    asking = re.compile(r"\.vendor\b|_is_postgres")
    found = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        # A migration must run as it was written, whatever the code becomes.
        if not path.is_relative_to(STORE)
        and not path.is_relative_to(PACKAGE / "migrations")
        and asking.search(path.read_text(encoding="utf-8"))
    )
    assert sorted(set(found) - VENDOR_ALLOWED) == []  # checks, admin, commands, tasks: none
    assert sorted(VENDOR_ALLOWED - set(found)) == []  # the list is kept exact


@pytest.mark.parametrize("attribute", ["enforces_limits", "estimates_counts", "listens", "vacuums"])
def test_the_store_says_what_its_engine_can_do(attribute: str) -> None:
    assert getattr(JobStore(connection.alias), attribute) is (ENGINE == "postgres")
    assert JobStore(connection.alias).claims_safely()


@pytest.mark.django_db
def test_the_store_reads_the_database_clock_in_utc() -> None:
    from datetime import UTC, datetime, timedelta

    clock = JobStore(connection.alias).clock()
    assert clock.tzinfo is UTC and abs(clock - datetime.now(UTC)) < timedelta(seconds=5)


@pytest.mark.django_db
def test_the_store_sees_a_transaction_that_a_failed_statement_aborted() -> None:
    from django.db import DatabaseError, transaction

    store = JobStore(connection.alias)
    with transaction.atomic():
        assert not store.transaction_aborted()
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT * FROM django_jobs_no_such_table")
        except DatabaseError:
            pass
        # Only PostgreSQL refuses every statement until the savepoint is rolled back.
        assert store.transaction_aborted() is (ENGINE == "postgres")
        transaction.set_rollback(True)


@pytest.mark.parametrize(("code", "drops"), [(1644, False), (1153, True), (2006, False)])
def test_only_mariadb_refuses_statements_with_an_operational_error(code: int, drops: bool) -> None:
    from django.db import OperationalError

    exc = OperationalError(code, "refused")
    store = JobStore(connection.alias)
    mariadb = isinstance(engine(connection.alias), MySQL)
    assert store.refused(exc) is (mariadb and code != 2006)  # 2006: server gone, a lost link
    assert store.dropped_connection(exc) is (mariadb and drops)


def test_rows_are_read_by_name_outside_the_engine_modules() -> None:
    # `row[7]`: a positional read of a database row; the engines' statements keep theirs.
    indexing = re.compile(r"\brows?\[\d+\]")
    found = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if not (path.parent == STORE and path.name in ENGINE_MODULES)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if indexing.search(line)
    ]
    assert found == []


def test_the_tables_module_and_every_other_stay_small() -> None:
    sizes = {
        str(path.relative_to(PACKAGE)): len(path.read_text(encoding="utf-8").splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    assert sizes["models.py"] <= 900
    over = {name: n for name, n in sizes.items() if n > 800}
    assert over == {}


def test_the_store_index_names_every_state_change_of_its_modules() -> None:
    # JobStore is the index a newcomer reads first: each public function of a concern
    # module is one of its methods (by the same name).
    from django_jobs.store import claim, enqueue, operators, replay, settle, workflows

    public = {
        name
        for module in (claim, enqueue, operators, replay, settle, workflows)
        for name, value in vars(module).items()
        if callable(value)
        and not name.startswith("_")
        and getattr(value, "__module__", None) == module.__name__
        and not isinstance(value, type)
    }
    public -= {"replay_request"}  # builds a ReplayRequest: control.replay's helper
    assert sorted(public - set(dir(JobStore))) == []


def test_the_store_imports_no_registry() -> None:
    imported = {
        node.module
        for path in STORE.glob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and node.module
    } | {
        f"django_jobs.{alias.name}"
        for path in STORE.glob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and node.module == "django_jobs"
        for alias in node.names
    }
    assert "django_jobs.registry" not in imported
