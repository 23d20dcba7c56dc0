"""Which job databases a command acts on (--database ALIAS), and how its output names them.

With a single job database a command says what it always said; with several
(DJANGO_JOBS["DATABASES"]) it acts on every one unless --database picks some, and
each line or section of its output names the database it is about.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from django.core.management.base import CommandError

from django_jobs import conf, limits
from django_jobs.management.arguments import add_repeatable


def add_database(parser: argparse.ArgumentParser, help: str) -> None:
    """Add --database ALIAS (repeatable, into `databases`): which job databases to act on."""
    add_repeatable(parser, "--database", dest="databases", type=str, metavar="ALIAS", help=help)


def job_databases(selected: Sequence[str] | None) -> list[str]:
    """Return the job databases --database named (each once, in order), or every one.

    A name that is not one of conf.databases() is a command-line error (exit code 2)
    that lists those, before any SQL. It is checked here rather than by an argparse
    type, as call_command's keyword arguments skip the parser's types.
    """
    aliases = conf.databases()
    if not selected:
        return list(aliases)
    for alias in selected:
        if alias not in aliases:
            raise CommandError(
                f"--database {limits.shown(alias)} is not a job database: "
                f"DJANGO_JOBS['DATABASES'] holds {', '.join(map(repr, aliases))}",
                returncode=2,
            )
    return list(dict.fromkeys(selected))


def several() -> bool:
    """Whether the project has several job databases: then the output names each."""
    return len(conf.databases()) > 1


def on(alias: str) -> str:
    """Return the prefix of a line about one database ("" with a single job database)."""
    return f"database {alias!r}: " if several() else ""
