"""python manage.py jobs status|pause|resume|schedules|enable|disable|cancel: operate the queues.

`jobs cancel JOB_ID ...` cancels jobs, `jobs cancel --workflow NAME` the steps of a workflow.
With several job databases (DJANGO_JOBS["DATABASES"]) each action acts on every one of
them, or on those named by --database ALIAS, and says which database each figure is of.
"""

from __future__ import annotations

import argparse
import difflib
import json
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connections
from django.utils import timezone

from django_jobs import control, limits, registry, status, tagging
from django_jobs.exceptions import InvalidJob
from django_jobs.management.arguments import (
    add_repeatable,
    free_text,
    job_id,
    queue_name,
    tag,
    workflow_name,
)
from django_jobs.management.databases import add_database, job_databases, on, several
from django_jobs.management.tables import require_job_tables
from django_jobs.store import JobStore
from django_jobs.worker import ticker


def _seconds(value: float | None) -> str:
    return "-" if value is None else limits.format_duration(value)


def _zone(value: datetime) -> str:
    return getattr(value.tzinfo, "key", None) or value.tzname() or "?"


def _when(value: datetime | None, now: datetime, zone: str | None = None) -> str:
    """Return value in the current time zone, named, and in `zone` too when that differs."""
    if value is None:
        return "-"
    delta = (value - now).total_seconds()
    local = timezone.localtime(value)
    text = f"{local:%Y-%m-%d %H:%M:%S} {_zone(local)}"
    if zone and zone != _zone(local):
        text += f" = {value.astimezone(ZoneInfo(zone)):%Y-%m-%d %H:%M:%S} {zone}"
    return f"{text} ({'in ' + _seconds(delta) if delta >= 0 else _seconds(-delta) + ' ago'})"


def _printable(value: object) -> str:
    """Return str(value) with what a terminal would obey (ESC, bidi controls ...) as \\u escapes.

    A hand-written row (a worker's host, a queue) must not move the cursor, recolour or
    reorder the operator's terminal: each character str.isprintable() refuses is shown as
    its JSON escape, as --json prints it.
    """
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else json.dumps(c)[1:-1] for c in text)


def _table(rows: Sequence[Sequence[object]], header: list[str]) -> str:
    rows = [[_printable(x) for x in row] for row in rows]
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows, strict=False)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(header, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return "\n".join(lines)


class Command(BaseCommand):
    help = (
        "Operate django-jobs: status, pause/resume queues, list/enable/disable schedules, "
        "cancel jobs or workflows."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        show = sub.add_parser("status", help="Per-queue figures and the live workers.")
        show.add_argument("--json", action="store_true", help="Print JSON instead of tables.")
        add_repeatable(
            show,
            "--tag",
            dest="tags",
            type=tag,
            metavar="TAG",
            help="Only the jobs and letters with this tag, per queue (repeatable: with all).",
        )
        add_database(show, "Only this job database (repeatable). Default: every one.")
        pause = sub.add_parser(
            "pause", help="Stop workers claiming from queues (running jobs finish)."
        )
        pause.add_argument("queues", nargs="+", type=queue_name, metavar="QUEUE")
        pause.add_argument(
            "--reason",
            type=free_text(limits.MAX_REASON_LENGTH),
            default="",
            help="Shown in the admin and `jobs status`.",
        )
        pause.add_argument(
            "--undeclared",
            action="store_true",
            help="Pause a queue that no handler declares and that holds no jobs (yet).",
        )
        add_database(pause, "Pause it in this job database (repeatable). Default: every one.")
        resume = sub.add_parser("resume", help="Let workers claim from paused queues again.")
        resume.add_argument("queues", nargs="+", type=queue_name, metavar="QUEUE")
        add_database(resume, "Resume it in this job database (repeatable). Default: every one.")
        schedules = sub.add_parser(
            "schedules", help="List the periodic schedules: next run, last run, last job."
        )
        add_database(schedules, "Only this job database (repeatable). Default: every one.")
        enable = sub.add_parser("enable", help="Enable schedules (missed ticks are not run).")
        enable.add_argument(
            "names", nargs="+", type=free_text(limits.MAX_SCHEDULE_LENGTH), metavar="SCHEDULE"
        )
        add_database(enable, "Enable them in this job database (repeatable). Default: every one.")
        disable = sub.add_parser("disable", help="Disable schedules without a deploy.")
        disable.add_argument(
            "names", nargs="+", type=free_text(limits.MAX_SCHEDULE_LENGTH), metavar="SCHEDULE"
        )
        add_database(disable, "Disable them in this job database (repeatable). Default: every one.")
        cancel = sub.add_parser(
            "cancel",
            help="Cancel jobs, or a workflow's steps: waiting ones now, running ones at their "
            "next heartbeat.",
        )
        cancel.add_argument("ids", nargs="*", type=job_id, metavar="JOB_ID")
        cancel.add_argument(
            "--workflow",
            type=workflow_name,
            metavar="NAME",
            help="Cancel the steps of this workflow that have not finished (instead of JOB_IDs).",
        )
        add_repeatable(
            cancel,
            "--tag",
            dest="tags",
            type=tag,
            metavar="TAG",
            help="Cancel the live jobs with this tag (repeatable: with all; instead of JOB_IDs).",
        )
        add_database(
            cancel,
            "Only the jobs of this job database (repeatable). Default: whichever holds each.",
        )

    def handle(self, *, action: str, databases: list[str] | None = None, **options: Any) -> None:
        aliases = job_databases(databases)
        for alias in aliases:  # every action reads or writes the job tables
            require_job_tables(alias)
        getattr(self, f"do_{action}")(databases=aliases, **options)

    def _sections(self, aliases: list[str]) -> Iterator[str]:
        """Yield each alias, headed by its name when the project has several job databases."""
        for n, alias in enumerate(aliases):
            if several():
                if n:
                    self.stdout.write("")
                self.stdout.write(f"Job database {alias!r}")
            yield alias

    # ---- actions -----------------------------------------------------------------

    def do_status(
        self,
        *,
        databases: list[str],
        json: bool = False,
        tags: list[str] | None = None,
        **options: Any,
    ) -> None:
        if tags:
            self._tagged_status(tags, json, databases)
            return
        # runjobs serves these by default; the others only with --queue NAME.
        declared = registry.declared_queues()
        reports: dict[str, status.Status | str] = {}
        for alias in databases:
            try:
                reports[alias] = status.status(alias)
            except DatabaseError as exc:
                # One job database away must not hide the others: it is the moment an
                # operator runs this. With a single one, the error is the whole answer.
                if not several():
                    raise
                text = str(exc).strip()
                reports[alias] = text.splitlines()[0] if text else type(exc).__name__
        if json:
            found: dict[str, dict[str, Any]] = {}
            for alias, report in reports.items():
                if isinstance(report, str):
                    found[alias] = {"error": report}
                    continue
                data = report.as_dict()
                for queue in data["queues"]:
                    queue["declared"] = queue["name"] in declared
                found[alias] = data
            self.stdout.write(_dumps(_by_database(found)))
        else:
            for alias in self._sections(databases):
                report = reports[alias]
                if isinstance(report, str):
                    self.stdout.write(f"could not read it: {_printable(report)}")
                else:
                    self._write_status(report, declared, alias)
        away = [alias for alias, report in reports.items() if isinstance(report, str)]
        if away:
            raise CommandError(
                f"could not read job database(s) {', '.join(map(repr, away))}; "
                "the figures above are the others'"
            )

    def _write_status(self, report: status.Status, declared: set[str], alias: str) -> None:
        """Write the tables of one job database's status."""
        rows = [
            [
                q.name,
                ", ".join(["PAUSED"] * q.paused + ["no handler"] * (q.name not in declared)),
                q.waiting,
                q.scheduled,
                q.running,
                q.blocked,
                _seconds(q.oldest_wait),
                q.done_last_hour,
                q.dead_last_hour,
            ]
            for q in report.queues
        ]
        header = [
            "queue",
            "state",
            "waiting",
            "scheduled",
            "running",
            "blocked",
            "oldest wait",
            "done 1h",
            "dead 1h",
        ]
        self.stdout.write(_table(rows, header))
        if any(q.name not in declared for q in report.queues):
            self.stdout.write(
                "no handler: no registered handler declares the queue, so runjobs serves it "
                "only when started with --queue NAME"
            )
        if report.dead_parents:
            dead = report.dead_parents
            more = dead.letters - len(dead.ids)
            self.stdout.write(
                f"{dead.jobs} blocked job(s) wait for {dead.letters} dead-lettered parent(s): "
                "replay them (admin, or `python manage.py replayjobs --id "
                f"{' --id '.join(dead.ids)}`{f', and {more} more' if more else ''})"
            )
        for cycle in report.cycles:
            waits = ", which waits for ".join(repr(k) for k in [*cycle.keys, cycle.keys[0]])
            self.stdout.write(
                f"blocked in a cycle: {waits}; nothing can release them (enqueued before "
                "such cycles were refused). Cancel the job that closes it "
                f"(`python manage.py jobs cancel {cycle.job}`), then replay the letter of key "
                f"{cycle.keys[0]!r} (`python manage.py replayjobs --id "
                f"{' --id '.join(cycle.letters)}`)"
            )
        if report.progress:
            self.stdout.write("")
            self.stdout.write("Running jobs reporting progress (latest attempts first)")
            rows = [[p.id, p.name, p.queue, p.text] for p in report.progress]
            self.stdout.write(_table(rows, ["job", "name", "queue", "progress"]))
        if report.flow:
            self.stdout.write("")
            self.stdout.write("Flow limits across the fleet (running now, starts this window)")
            if not JobStore(alias).enforces_limits:
                vendor = connections[alias].display_name
                self.stdout.write(
                    f"not enforced: the jobs database is {vendor}, and only PostgreSQL "
                    "enforces them (django_jobs.W302)"
                )
            rows = [
                [
                    f"{'handler' if f.kind == 'name' else 'queue'} {f.value}",
                    "-" if f.global_concurrency is None else f"{f.running}/{f.global_concurrency}",
                    "-" if f.rate_limit is None else f"{f.starts}/{f.rate_limit}",
                    ", ".join(
                        f"{p or '(none)'}: {r} running, {n} started" for p, r, n in f.partitions
                    )
                    or ("-" if not f.partitioned else "(idle)"),
                ]
                for f in report.flow
            ]
            self.stdout.write(
                _table(rows, ["limited", "concurrency", "rate", "busiest partitions"])
            )
        if report.unknown_names:
            self.stdout.write("")
            self.stdout.write(
                "Waiting: no live worker knows these job names (a rolling deploy not done, "
                "or a handler removed); their jobs are dead-lettered as unknown_name from then on"
            )
            rows = [
                [
                    u.name,
                    u.jobs,
                    _when(u.since, report.now),
                    _when(u.dead_letter_at, report.now) if u.dead_letter_at else "never",
                ]
                for u in report.unknown_names
            ]
            self.stdout.write(_table(rows, ["name", "jobs", "unknown since", "dead-lettered"]))
        self.stdout.write("")
        self.stdout.write(f"{len(report.workers)} live worker(s)")
        waiting = sum(q.waiting for q in report.queues)
        if waiting and not report.workers:
            self.stdout.write(
                f"{waiting} job(s) are waiting and no worker is running: "
                "start one with `python manage.py runjobs`"
            )
        if report.workers:
            rows = [
                [
                    w.host,
                    w.pid,
                    ",".join(w.queues),
                    w.concurrency,
                    w.running,
                    _when(w.started_at, report.now),
                    _when(w.last_seen_at, report.now),
                ]
                for w in report.workers
            ]
            self.stdout.write(
                _table(
                    rows,
                    ["host", "pid", "queues", "concurrency", "running", "started", "last seen"],
                )
            )
            for w in report.workers:
                if w.abandoned:
                    self.stdout.write(
                        f"worker {w.host}:{w.pid}: {w.abandoned} of {w.concurrency} thread(s) "
                        "run handlers abandoned past their timeout (their jobs stay leased "
                        "until they return); it exits with code 3 for a restart when all are"
                    )

    def do_pause(
        self,
        *,
        databases: list[str],
        queues: list[str],
        reason: str,
        undeclared: bool,
        **options: Any,
    ) -> None:
        # Undeclared, and without jobs in every database it would be paused in.
        unknown = (
            []
            if undeclared
            else sorted(
                set.intersection(
                    *(set(control.unknown_queues(queues, using=alias)) for alias in databases)
                )
            )
        )
        if unknown:
            declared = sorted(registry.declared_queues())
            hints = "".join(
                f"; did you mean {close[0]!r} for {name!r}?"
                for name in unknown
                if (close := difflib.get_close_matches(name, declared, n=1))
            )
            raise CommandError(
                f"no handler declares queue(s) {', '.join(map(repr, unknown))} and none holds "
                f"jobs, so there is nothing to pause (the declared queues: "
                f"{', '.join(declared)}){hints} To pause it before its handlers are deployed, "
                "pass --undeclared."
            )
        changed = {
            alias: control.pause(queues, by="manage.py jobs", reason=reason, using=alias)
            for alias in databases
        }
        self.stdout.write(
            f"paused {_per_database(changed, 'queue(s)')}; workers stop claiming from them "
            "within one poll interval"
        )

    def do_resume(self, *, databases: list[str], queues: list[str], **options: Any) -> None:
        changed = {alias: control.resume(queues, using=alias) for alias in databases}
        self.stdout.write(f"resumed {_per_database(changed, 'queue(s)')}")

    def do_schedules(self, *, databases: list[str], **options: Any) -> None:
        from django_jobs.models import Schedule

        for alias in self._sections(databases):
            try:
                specs = ticker.sync(alias)
            except InvalidJob as exc:
                raise CommandError(str(exc)) from None
            now = ticker.db_now(alias)
            rows = []
            for row in Schedule.objects.using(alias):
                spec = specs.get(row.name)
                zone = spec.timezone if spec and spec.cron else None  # `every` counts in UTC
                upcoming = spec.next_tick(now) if spec and row.enabled and row.declared else None
                state = "enabled" if row.enabled else "disabled"
                if not row.declared:
                    state = "not declared"
                rows.append(
                    [
                        row.name,
                        spec.describe() if spec else row.cron or f"every {row.every}s",
                        row.job_name,
                        state,
                        _when(upcoming, now, zone),
                        _when(row.last_tick_at, now, zone),
                        row.last_job_id or "-",
                    ]
                )
            header = ["schedule", "when", "job", "state", "next run", "last tick", "last job"]
            self.stdout.write(_table(rows, header))

    def do_enable(self, *, databases: list[str], names: list[str], **options: Any) -> None:
        self._switch(names, databases, enable=True)

    def do_disable(self, *, databases: list[str], names: list[str], **options: Any) -> None:
        self._switch(names, databases, enable=False)

    def _switch(self, names: list[str], databases: list[str], *, enable: bool) -> None:
        """Enable or disable the schedules `names` in each of `databases`."""
        from django_jobs.models import Schedule

        self._known(names, databases)
        changed = {}
        for alias in databases:
            rows = Schedule.objects.using(alias).filter(name__in=names)
            changed[alias] = rows.enable() if enable else rows.disable()
        verb = "enabled" if enable else "disabled"
        self.stdout.write(f"{verb} {_per_database(changed, 'schedule(s)')}")

    def _tagged_status(self, tags: list[str], json: bool, databases: list[str]) -> None:
        counts = {alias: status.tagged_counts(tags, alias) for alias in databases}
        if json:
            found = {
                alias: {"tags": tags, "queues": [r._asdict() for r in rows]}
                for alias, rows in counts.items()
            }
            self.stdout.write(_dumps(_by_database(found)))
            return
        header = ["queue", "waiting", "scheduled", "running", "blocked", "dead (not replayed)"]
        for alias in self._sections(databases):
            self.stdout.write(f"Jobs and dead letters tagged {', '.join(map(repr, tags))}")
            self.stdout.write(_table([list(row) for row in counts[alias]], header))

    def do_cancel(
        self,
        *,
        databases: list[str],
        ids: list[uuid.UUID],
        workflow: str | None = None,
        tags: list[str] | None = None,
        **options: Any,
    ) -> None:
        # Exit code 2 as argparse's own errors: the command line is wrong, nothing was done.
        if workflow is not None and ids:
            raise CommandError("give JOB_IDs or --workflow NAME, not both", returncode=2)
        if tags and (ids or workflow is not None):
            raise CommandError("give --tag TAG alone, without JOB_IDs or --workflow", returncode=2)
        if tags:
            from django_jobs.models import Job

            ids = [
                job
                for alias in databases
                for job in tagging.tagged(Job.objects.using(alias), tags).values_list(
                    "id", flat=True
                )
            ]
            if not ids:
                raise CommandError(f"no live job tagged {', '.join(map(repr, tags))}")
        if workflow is not None:
            self._cancel_workflow(workflow, databases)
            return
        if not ids:
            raise CommandError(
                "say what to cancel: JOB_ID ... or --workflow NAME (or --tag TAG)", returncode=2
            )
        # Each id is in one database at most: asking each one cancels it where it is.
        results = {
            alias: control.cancel(ids, by="manage.py jobs", using=alias) for alias in databases
        }
        for alias, result in results.items():
            self.stdout.write(on(alias) + _cancelled(result))
        missing = len(ids) - sum(r.cancelled + r.requested for r in results.values())
        if missing:
            self.stderr.write(
                f"{missing} job(s) were not live (finished, dead or already cancelling)"
            )

    def _cancel_workflow(self, name: str, databases: list[str]) -> None:
        from django_jobs.models import WorkflowStep

        holding = [
            alias
            for alias in databases
            if WorkflowStep.objects.using(alias).filter(workflow=name).exists()
        ]
        if not holding:
            raise CommandError(f"no workflow named {name!r}")
        live = False
        for alias in holding:
            result = control.cancel_workflow(name, by="manage.py jobs", using=alias)
            self.stdout.write(f"{on(alias)}workflow {name!r}: {_cancelled(result)}")
            live = live or bool(result.cancelled or result.requested)
        if not live:
            self.stderr.write(
                f"workflow {name!r} has no live step (all finished, dead or already cancelling)"
            )

    def _known(self, names: list[str], databases: list[str]) -> None:
        """Raise CommandError for a name that is a schedule in none of the databases."""
        from django_jobs.models import Schedule

        found: set[str] = set()
        for alias in databases:
            ticker.sync(alias)
            rows = Schedule.objects.using(alias).filter(name__in=names)
            found |= set(rows.values_list("name", flat=True))
        unknown = sorted(set(names) - found)
        if unknown:
            raise CommandError(f"no schedule named {', '.join(map(repr, unknown))}")


def _per_database(counts: dict[str, int], what: str) -> str:
    """Say how many rows changed: "2 queue(s)", or per database with several of them."""
    if not several():
        return f"{sum(counts.values())} {what}"
    return ", ".join(f"{n} {what} on database {alias!r}" for alias, n in counts.items())


def _by_database(found: dict[str, dict[str, Any]]) -> Any:
    """Return the JSON of each database's figures, as one object.

    With a single job database, its figures as they always were; with several,
    {"databases": [{"database": ALIAS, ...its figures}, ...]}.
    """
    if not several():
        (only,) = found.values()
        return only
    return {"databases": [{"database": alias, **data} for alias, data in found.items()]}


def _cancelled(result: control.CancelResult) -> str:
    """Say what a cancel did, in the words of `jobs status` (waiting, scheduled, blocked)."""
    kinds = limits.counted(
        (result.waiting, "waiting"), (result.scheduled, "scheduled"), (result.blocked, "blocked")
    )
    detail = f" ({', '.join(kinds)})" if kinds else ""
    return (
        f"cancelled {result.cancelled} job(s){detail}; "
        f"asked the workers of {result.requested} running job(s) to stop them"
    )


def _dumps(value: Any) -> str:
    return json.dumps(value, indent=2, default=str)
