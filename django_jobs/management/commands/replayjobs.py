"""python manage.py replayjobs: replay dead letters in bulk, by reason, name, queue and time.

With several job databases (DJANGO_JOBS["DATABASES"]) each letter is replayed in the
database that holds it, every job database's by default, or those --database names.
"""

from __future__ import annotations

import argparse
import getpass
import sys
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from django_jobs import control, limits, tagging
from django_jobs.management.arguments import (
    add_repeatable,
    free_text,
    job_id,
    job_name,
    positive_int,
    queue_name,
    seconds_or_zero,
    tag,
)
from django_jobs.management.databases import add_database, job_databases, on, several
from django_jobs.management.tables import require_job_tables
from django_jobs.models import DeadLetter, DeadLetterQuerySet, DeadReason
from django_jobs.rows import ReplayReport

# Selections longer than this get a progress bar (or, when not on a terminal, progress lines).
PROGRESS_FROM = 500
LISTED = 20  # letters listed by --dry-run at verbosity 1 (all of them at 2)


def when(text: str) -> datetime:
    """Parse an ISO date or datetime (local time unless it says otherwise), or an age ('2h')."""
    text = text.strip()
    if text[:1].isdigit() and text[-1:].isalpha():  # an age: 90m, 2h, 7d
        try:
            age = limits.duration(text, what="the age")
        except ValueError as exc:
            if "ten years" in str(exc):
                exc = ValueError(f"{limits.shown(text)} is more than ten years ago; give a date")
            raise argparse.ArgumentTypeError(str(exc)) from None
        if age is not None:
            return timezone.now() - age
    try:
        value = parse_datetime(text)
        if value is None and (day := parse_date(text)) is not None:
            value = datetime.combine(day, datetime.min.time())
        if value is not None:
            if timezone.is_naive(value):
                value = timezone.make_aware(value)
            value.astimezone(UTC)  # every database stores it in UTC: it must have one
    except (ValueError, OverflowError):
        value = None
    if value is None:
        raise argparse.ArgumentTypeError(
            f"{limits.shown(text)} is not a date (2026-11-30), a date and time "
            "(2026-11-30T14:00), or an age (90m, 2h, 7d)"
        )
    return value


def run_time(text: str) -> datetime:
    """Parse --run-at as `when` does, held to the run times enqueue takes."""
    value = when(text)
    try:
        return limits.run_time("--run-at", value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def reason(text: str) -> str:
    if text not in DeadReason.values:
        raise argparse.ArgumentTypeError(
            f"{limits.shown(text)} is not a reason; one of: {', '.join(DeadReason.values)}"
        )
    return text


def _default_by() -> str:
    try:
        return f"replayjobs ({getpass.getuser()})"
    except (KeyError, OSError):  # no login name in some containers
        return "replayjobs"


class Command(BaseCommand):
    help = (
        "Replay dead letters: each gets one new live job (same name, payload, queue, priority "
        "and key; fresh attempts). Letters already replayed are left out."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_repeatable(
            parser,
            "--reason",
            dest="reasons",
            type=reason,
            metavar="REASON",
            help=f"Only this reason (repeatable): {', '.join(DeadReason.values)}.",
        )
        add_repeatable(
            parser,
            "--name",
            dest="names",
            type=job_name,
            metavar="NAME",
            help="Only jobs of this name (repeatable).",
        )
        add_repeatable(
            parser,
            "--queue",
            dest="queues",
            type=queue_name,
            metavar="QUEUE",
            help="Only jobs of this queue (repeatable).",
        )
        add_repeatable(
            parser,
            "--tag",
            dest="tags",
            type=tag,
            metavar="TAG",
            help="Only jobs with this tag (repeatable: with every one given).",
        )
        parser.add_argument(
            "--dead-after",
            type=when,
            metavar="WHEN",
            help="Only letters that died at or after WHEN (2026-11-30, 2026-11-30T14:00, 2h).",
        )
        parser.add_argument(
            "--dead-before", type=when, metavar="WHEN", help="Only letters that died before WHEN."
        )
        add_repeatable(
            parser,
            "--id",
            dest="ids",
            type=job_id,
            metavar="JOB_ID",
            help="Only this dead letter (repeatable).",
        )
        parser.add_argument(
            "--all",
            action="store_true",
            dest="everything",
            help="Replay every letter not replayed yet (needed when no filter is given).",
        )
        parser.add_argument(
            "--limit", type=positive_int, help="Replay at most this many (oldest first)."
        )
        when_group = parser.add_mutually_exclusive_group()
        when_group.add_argument(
            "--delay",
            type=seconds_or_zero,
            metavar="SECONDS",
            help="Make the new jobs due this many seconds from now.",
        )
        when_group.add_argument(
            "--run-at", type=run_time, metavar="WHEN", help="Make the new jobs due at WHEN."
        )
        parser.add_argument(
            "--by",
            type=free_text(limits.MAX_BY_LENGTH),
            help="Who replays, as recorded on each letter.",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Show what would be replayed; change nothing."
        )
        add_database(
            parser, "Replay the letters of this job database (repeatable). Default: every one."
        )

    def handle(
        self,
        *,
        reasons: list[str] | None,
        names: list[str] | None,
        queues: list[str] | None,
        dead_after: datetime | None,
        dead_before: datetime | None,
        ids: list[uuid.UUID] | None,
        everything: bool,
        tags: list[str] | None = None,
        limit: int | None,
        delay: float | None,
        run_at: datetime | None,
        by: str | None,
        dry_run: bool,
        verbosity: int,
        databases: list[str] | None = None,
        **options: Any,
    ) -> None:
        if not (
            reasons or names or queues or tags or dead_after or dead_before or ids or everything
        ):
            raise CommandError(
                "say which letters: --reason, --name, --queue, --tag, --dead-after, "
                "--dead-before or --id, or --all for every letter not replayed yet",
                returncode=2,
            )
        if dead_after and dead_before and dead_after >= dead_before:
            raise CommandError("--dead-after must be earlier than --dead-before", returncode=2)
        aliases = job_databases(databases)
        for alias in aliases:
            require_job_tables(alias)
        selected = {}
        for alias in aliases:
            letters = DeadLetter.objects.using(alias).all()
            if not ids:
                letters = letters.pending()
            if ids:
                letters = letters.filter(id__in=ids)
            if reasons:
                letters = letters.filter(reason__in=reasons)
            if names:
                letters = letters.filter(name__in=names)
            if queues:
                letters = letters.filter(queue__in=queues)
            if tags:
                letters = tagging.tagged(letters, tags)
            if dead_after:
                letters = letters.filter(dead_at__gte=dead_after)
            if dead_before:
                letters = letters.filter(dead_at__lt=dead_before)
            selected[alias] = letters.order_by("dead_at", "id")
        if limit:
            selected = _oldest(selected, limit)

        if dry_run:
            self._dry_run(selected, verbosity)
            return
        counts = {alias: letters.count() for alias, letters in selected.items()}
        total = sum(counts.values())
        progress = self._progress(total) if total >= PROGRESS_FROM and verbosity >= 1 else None
        done = 0
        for alias, letters in selected.items():
            report = control.replay(
                letters,
                by=by or _default_by(),
                run_at=run_at,
                delay=delay,
                progress=_offset(progress, done),
            )
            done += counts[alias]
            self._report(report, on(alias), verbosity)

    def _report(self, report: ReplayReport, prefix: str, verbosity: int) -> None:
        """Say what one database's replay did, `prefix` naming the database when several."""
        if verbosity >= 1:
            self.stdout.write(f"{prefix}{report}.")
            for label, items in (
                ("already replayed", report.already),
                ("key held by a live job", report.key_taken),
                ("key completed since", report.completed),
                ("no handler registered under its name", report.unknown),
                ("it would wait for jobs that wait for it: a cycle", report.cycles),
            ):
                for item in items[:LISTED] if verbosity < 2 else items:
                    self.stdout.write(f"  not replayed ({label}): {item}")
        if verbosity >= 2:
            for letter, job in report.replayed.items():
                self.stdout.write(f"  replayed {letter} as job {job}")

    def _dry_run(self, selected: dict[str, DeadLetterQuerySet], verbosity: int) -> None:
        total = sum(letters.count() for letters in selected.values())
        self.stdout.write(
            f"Dry run: {total} dead letter(s) would be replayed; nothing was changed."
        )
        columns = ("dead_at", "id", "name", "queue", "reason")
        rows = sorted(
            (*row, alias)
            for alias, letters in selected.items()
            for row in (
                letters.values_list(*columns)
                if verbosity >= 2
                else letters.values_list(*columns)[:LISTED]
            )
        )
        shown = rows if verbosity >= 2 else rows[:LISTED]
        for dead_at, pk, name, queue, why, alias in shown:
            where = f"  database={alias}" if several() else ""
            self.stdout.write(
                f"  {pk}  {name}  queue={queue}  reason={why}  "
                f"dead_at={dead_at:%Y-%m-%d %H:%M:%S}{where}"
            )
        if verbosity < 2 and total > LISTED:
            self.stdout.write(f"  … and {total - LISTED} more (-v 2 lists them all)")

    def _progress(self, total: int) -> Callable[[int, int], None]:
        out = self.stderr
        tty = sys.stderr.isatty() and out._out is sys.stderr
        last = [-1]

        def show(done: int, _total: int) -> None:
            percent = done * 100 // max(total, 1)
            if tty:
                filled = percent * 30 // 100
                out.write(
                    f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{total} ({percent}%)",
                    ending="",
                )
                if done >= total:
                    out.write("")
                out.flush()
            elif percent // 10 > last[0] // 10 or done >= total:
                # Not a terminal (a log file): a line every tenth of the way.
                last[0] = percent
                out.write(f"replayed {done}/{total} ({percent}%)")

        return show


def _oldest(selected: dict[str, DeadLetterQuerySet], limit: int) -> dict[str, DeadLetterQuerySet]:
    """Keep the `limit` oldest letters of the selection, across the databases it spans."""
    found = sorted(
        (dead_at, pk, alias)
        for alias, letters in selected.items()
        for dead_at, pk in letters.values_list("dead_at", "id")[:limit]
    )[:limit]
    return {
        alias: DeadLetter.objects.using(alias)
        .filter(id__in=[pk for _, pk, held in found if held == alias])
        .order_by("dead_at", "id")
        for alias in selected
    }


def _offset(
    progress: Callable[[int, int], None] | None, done: int
) -> Callable[[int, int], None] | None:
    """Return progress for one database's replay, counting on from the `done` of those before."""
    if progress is None:
        return None
    return lambda replayed, total: progress(done + replayed, total)
