"""python manage.py prunejobs: delete old completion markers and dead letters, in small batches.

A job's workflow rows (its Dependency edges and WorkflowStep row) go with its last record.
Every job database is pruned in turn (DJANGO_JOBS["DATABASES"]), or those --database names.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand

from django_jobs import conf, retention
from django_jobs.management.arguments import duration_or_none, positive_int
from django_jobs.management.databases import add_database, job_databases, on
from django_jobs.management.tables import require_job_tables


class Command(BaseCommand):
    help = (
        "Delete completion markers and dead letters older than KEEP_MARKERS / KEEP_DEAD_LETTERS "
        "(workers do this on their own; this is for cron-less setups, backfills and checks)."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
        )
        parser.add_argument(
            "--markers",
            type=duration_or_none,
            default=retention.SETTINGS,
            metavar="AGE",
            help="Keep markers this long (7d, 12h, 30m, 90s or 'none' to keep all). "
            "Default: KEEP_MARKERS.",
        )
        parser.add_argument(
            "--dead-letters",
            type=duration_or_none,
            default=retention.SETTINGS,
            metavar="AGE",
            help="Keep dead letters this long. Default: KEEP_DEAD_LETTERS.",
        )
        parser.add_argument(
            "--batch", type=positive_int, help="Rows per DELETE (default PRUNE_BATCH)."
        )
        add_database(parser, "Prune this job database (repeatable). Default: every one.")

    def handle(
        self,
        *,
        dry_run: bool,
        markers: Any,
        dead_letters: Any,
        batch: int | None,
        verbosity: int,
        databases: list[str] | None = None,
        **options: Any,
    ) -> None:
        aliases = job_databases(databases)
        for alias in aliases:
            require_job_tables(alias)
        keep = {"keep_markers": markers, "keep_dead_letters": dead_letters}
        for alias in aliases:
            if dry_run:
                result = retention.count_prunable(alias, **keep)
                self.stdout.write(f"{on(alias)}would delete {_counts(result)}")
                continue
            result = retention.prune(alias, **keep, batch=batch or conf.get("PRUNE_BATCH"))
            self.stdout.write(f"{on(alias)}deleted {_counts(result)} in {result.batches} batch(es)")


def _counts(result: retention.PruneResult) -> str:
    # One wording for the dry run and the real one, so their figures compare line to line.
    return (
        f"{result.markers} completion marker(s), {result.dead_letters} dead letter(s), "
        f"{result.dependencies} workflow dependency edge(s) and "
        f"{result.workflow_steps} workflow step row(s)"
    )
