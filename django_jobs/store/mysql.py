"""MySQL and MariaDB: the ORM engine with InnoDB's quirks.

Where a newcomer adds a MariaDB-specific tweak: the claim's locking read of due jobs
(``lock_due``, by primary key with index hints), the settle's and cancel's locked
deletes (``delete_locked``, FORCE INDEX (PRIMARY)), and the statements' size
against the server's max_allowed_packet (``refuse_oversized``, ``batches``).
Deadlock retries are engine.retrying_deadlocks' (MySQL's error 1213 there).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connections, models
from django.db.models.functions import Now
from django.db.models.sql import DeleteQuery

from django_jobs import limits
from django_jobs.exceptions import InvalidPayload
from django_jobs.models import JobQuerySet
from django_jobs.rows import NewJob
from django_jobs.store.base import BULK_BATCH, json_text
from django_jobs.store.portable import Portable

# MySQL and MariaDB refuse a statement longer than the server's max_allowed_packet
# (error 1153, and drop the connection). What an INSERT of jobs adds to their payloads,
# at most: per row (names, key, dates, the other columns escaped) and per statement.
ROW_OVERHEAD = 4096
STATEMENT_OVERHEAD = 4096
# What a job's trace context, tags and metadata (limits.MAX_TAGS...) add at most:
# 4 bytes a character, with their JSON quotes and separators.
LABELS_OVERHEAD = ROW_OVERHEAD + 4 * (
    limits.MAX_TRACE_CONTEXT_LENGTH
    + limits.MAX_TAGS * (limits.MAX_TAG_LENGTH + 4)
    + limits.MAX_META_KEYS * (limits.MAX_META_KEY_LENGTH + limits.MAX_META_VALUE_LENGTH + 8)
)

# Statements this small need no look at max_allowed_packet (MySQL's and MariaDB's
# defaults are 64 MiB and 16 MiB; 1 MiB is MySQL 5.5's).
_SMALLEST_PACKET = 1024 * 1024

# The longest statement the server takes (read once per connection, _max_packet).
MAX_ALLOWED_PACKET = "SELECT @@max_allowed_packet"


# Errors that come as an OperationalError although the statement was refused, not the
# connection lost: sent again, it fails again. 1644 is a SIGNAL (a trigger's SQLSTATE
# '45000'); 1153 a statement larger than max_allowed_packet, after which the server
# drops the connection too.
_SIGNAL = 1644
_PACKET_TOO_LARGE = 1153
_REFUSED = frozenset({_SIGNAL, _PACKET_TOO_LARGE})


class MySQL(Portable):
    """MySQL and MariaDB (Django's vendor "mysql")."""

    def refused(self, exc: BaseException) -> bool:
        return bool(exc.args) and exc.args[0] in _REFUSED

    def dropped_connection(self, exc: BaseException) -> bool:
        return bool(exc.args) and exc.args[0] == _PACKET_TOO_LARGE

    def refuse_oversized(self, alias: str, jobs: Sequence[NewJob]) -> None:
        """On MySQL and MariaDB, raise InvalidPayload for a payload whose INSERT would be
        longer than the server's max_allowed_packet (before anything is written)."""
        for index, job in enumerate(jobs):
            # At most 4 bytes a character, in UTF-8 or escaped: a payload this short fits
            # (with its labels: LABELS_OVERHEAD at most).
            if 4 * len(job.payload) + LABELS_OVERHEAD + STATEMENT_OVERHEAD <= _SMALLEST_PACKET:
                continue
            packet = _max_packet(alias)
            room = packet - ROW_OVERHEAD - STATEMENT_OVERHEAD - _labels_size(job)
            if (size := _sent_size(job.payload)) > room:
                raise InvalidPayload(
                    f"{f'job {index}: ' if len(jobs) > 1 else ''}payload is {size} bytes as "
                    f"sent to the database; its INSERT would be longer than the server's "
                    f"max_allowed_packet ({packet} bytes), which leaves room for {room}; "
                    "store large data elsewhere and pass its id"
                )

    def batches(self, alias: str, jobs: list[NewJob]) -> list[list[NewJob]]:
        """Split jobs into bulk_create batches of BULK_BATCH rows, on MySQL and MariaDB
        also each shorter than max_allowed_packet (each job checked by _refuse_oversized)."""
        batches = [jobs[i : i + BULK_BATCH] for i in range(0, len(jobs), BULK_BATCH)]
        sizes = [_sent_size(job.payload) + _labels_size(job) + ROW_OVERHEAD for job in jobs]
        if sum(sizes) + STATEMENT_OVERHEAD <= _SMALLEST_PACKET:
            return batches
        room = _max_packet(alias) - STATEMENT_OVERHEAD
        batches, used = [], room  # the first job starts a batch
        for job, size in zip(jobs, sizes, strict=True):
            if used + size > room or len(batches[-1]) >= BULK_BATCH:
                batches.append([])
                used = 0
            batches[-1].append(job)
            used += size
        return batches

    def delete_locked(self, queryset: models.QuerySet[Any]) -> int:
        """Delete queryset's rows, which this transaction holds locked; return how many.

        MySQL and MariaDB plan a DELETE of many of a small table's ids as a full scan,
        which waits for every row it passes, ours or not: a settle holding its batch then
        waits for a row another transaction holds, out of id order, and deadlocks with
        one that waits for the batch (an enqueue naming both). FORCE INDEX (PRIMARY)
        keeps the DELETE to its own rows.
        """
        alias = queryset.db
        query = queryset.query.clone()
        query.clear_ordering(force=True)
        query.__class__ = DeleteQuery
        statement, params = query.get_compiler(alias).as_sql()
        table = connections[alias].ops.quote_name(queryset.model._meta.db_table)
        plain = f"DELETE FROM {table} "  # noqa: S608 - a quoted table name, no input
        if not statement.startswith(plain):  # pragma: no cover - Django's single-table form
            return queryset.delete()[0]
        hinted = f"DELETE {table} FROM {table} FORCE INDEX (PRIMARY) " + statement[len(plain) :]
        with connections[alias].cursor() as cursor:
            cursor.execute(hinted, params)
            return int(cursor.rowcount)

    def lock_due(self, jobs: JobQuerySet, due: JobQuerySet, wanted: int) -> list[uuid.UUID]:
        """Lock up to `wanted` of `due`'s jobs (MySQL, MariaDB), skipping locked ones.

        A locking read there locks every row it passes, matching or not: due jobs
        are found in the claim index's order, but a workflow's blocked steps
        (run_at far ahead) sit in the same queue range, and with fewer due jobs than
        wanted, or several queues (a filesort), the scan read and locked all of them
        and waited on rows a settle was deleting. So the due jobs are first read
        without locks, then locked by primary key, re-checked; those another claim
        took meanwhile are passed over, a few rounds at most.
        """
        if not jobs.query.select_for_update:  # a claim without row locks: no scan to avoid
            return super().lock_due(jobs, due, wanted)
        peek = due.all()
        peek.query.select_for_update = False
        taken: list[uuid.UUID] = []
        seen: list[uuid.UUID] = []
        for _round in range(3):
            asked = wanted - len(taken)
            found = _ids_with_index(
                peek.exclude(id__in=seen).values_list("id", flat=True)[:asked],
                "django_jobs_job_claim",
            )
            if not found:
                break
            seen += found
            taken += _ids_with_index(
                jobs.filter(id__in=found, locked_by__isnull=True, run_at__lte=Now())
                .order_by("-priority", "run_at", "id")
                .values_list("id", flat=True),
                "PRIMARY",
            )
            if len(taken) >= wanted or len(found) < asked:  # all taken, or no more due
                break
        return taken

    def lock_ids(self, jobs: JobQuerySet, ids: list[uuid.UUID]) -> list[uuid.UUID]:
        """Lock those of `ids` still due by primary key (a scan of the claim index would
        lock every row it passes: see lock_due)."""
        if not ids:
            return []
        return _ids_with_index(
            jobs.filter(id__in=ids, locked_by__isnull=True, run_at__lte=Now()).values_list(
                "id", flat=True
            ),
            "PRIMARY",
        )


def _labels_size(job: NewJob) -> int:
    """Return the bytes a job's trace context, tags and metadata add to its INSERT."""
    if job.trace_context is None and job.tags is None and job.meta is None:
        return 0  # the common case
    texts = (job.trace_context, json_text(job.tags), json_text(job.meta))
    return sum(_sent_size(text) for text in texts if text is not None)


def _sent_size(payload: str) -> int:
    """Return the bytes payload takes in a MySQL statement: UTF-8, quotes and \\ escaped."""
    return len(payload.encode()) + payload.count('"') + payload.count("\\") + payload.count("'")


def _max_packet(alias: str) -> int:
    """Return the server's max_allowed_packet, read once per connection."""
    conn = connections[alias]
    conn.ensure_connection()
    cached = getattr(conn, "_django_jobs_max_packet", None)
    if cached is None or cached[0] is not conn.connection:
        with conn.cursor() as cursor:
            cursor.execute(MAX_ALLOWED_PACKET)
            cached = (conn.connection, int(cursor.fetchone()[0]))
        setattr(conn, "_django_jobs_max_packet", cached)  # noqa: B010 - not a wrapper field
    return int(cached[1])


def _ids_with_index(queryset: models.QuerySet[Any, Any], index: str) -> list[uuid.UUID]:
    """Run a values_list("id", flat=True) queryset with FORCE INDEX (index).

    The ORM has no index hints; the compiled statement (its FOR UPDATE SKIP LOCKED
    and LIMIT as they are) gets one after its table. Elsewhere, or for a statement
    of another form, the queryset runs as it is.
    """
    alias = queryset.db
    connection = connections[alias]
    try:
        statement, params = queryset.query.get_compiler(alias).as_sql()
    except EmptyResultSet:  # e.g. names=[]: Django runs no statement either
        return []
    table = connection.ops.quote_name(queryset.model._meta.db_table)
    plain = f" FROM {table} "  # noqa: S608 - a quoted table name, no input
    if statement.count(plain) != 1:  # pragma: no cover - Django's single-table form
        return list(queryset)
    hinted = statement.replace(plain, f"{plain}FORCE INDEX ({connection.ops.quote_name(index)}) ")
    with connection.cursor() as cursor:
        cursor.execute(hinted, params)
        return [queryset.model._meta.pk.to_python(row[0]) for row in cursor.fetchall()]
