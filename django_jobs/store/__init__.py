"""The store: every named state change of live jobs, markers and letters.

``JobStore(alias)`` is the index: one line per state change, each delegating to
the module of its concern (enqueue, claim, settle, workflows, operators, replay).
What differs by database is the engine's (``engine.engine(alias)``: postgres.py's
one-statement paths, portable.py's ORM paths, mysql.py's MariaDB quirks), chosen
once per alias. Reads that change nothing are the models' querysets
(``Job.objects.due_for()``, ``counts_by_queue()``...). The store imports no
registry: its callers hand it what it needs of the handlers.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from django_jobs import conf
from django_jobs.models import DeadLetter, DeadLetterQuerySet, Job, JobQuerySet
from django_jobs.rows import (
    CancelReport,
    ClaimedJob,
    ClaimRequest,
    EnqueueResult,
    Finished,
    Leases,
    NewJob,
    Parent,
    ReplayReport,
    ReplayRequest,
    Settled,
    Step,
)
from django_jobs.store import claim, enqueue, operators, parents, replay, settle, workflows
from django_jobs.store.engine import engine


def _asked(capability: str, doc: str) -> Any:
    """A read-only attribute of JobStore that asks the alias's engine, not its vendor."""
    return property(lambda store: getattr(engine(store.alias), capability), doc=doc)


class JobStore:
    """The state changes of one database alias's jobs: ``JobStore(alias).claim(request)``."""

    __slots__ = ("alias", "jobs")

    def __init__(self, alias: str | None = None) -> None:
        self.alias: str = alias or conf.database()  # None: DJANGO_JOBS["DATABASE"]
        # The live jobs of the alias: never evaluated itself (each use filters a clone),
        # so one per store, as the worker keeps one store: no queryset built per call.
        self.jobs = JobQuerySet(Job, using=self.alias)

    # ---- what the alias's engine can do (asked instead of its vendor) ------

    enforces_limits: bool = _asked(
        "enforces_limits", "Whether flow limits (global_concurrency, rate_limit) hold here."
    )
    estimates_counts: bool = _asked(
        "estimates_counts", "Whether the database offers a cheap row-count estimate."
    )
    listens: bool = _asked("listens", "Whether idle workers can wait for NOTIFY (LISTEN).")
    vacuums: bool = _asked(
        "vacuums", "Whether deleted rows' space is reusable only after a VACUUM (upkeep's)."
    )

    def refused(self, exc: BaseException) -> bool:
        """Whether exc, an OperationalError, refused the statement (sent again, it fails)."""
        return engine(self.alias).refused(exc)

    def dropped_connection(self, exc: BaseException) -> bool:
        """Whether the server closed the connection after refusing the statement (exc)."""
        return engine(self.alias).dropped_connection(exc)

    def clock(self) -> datetime:
        """The database's clock, aware in UTC (SQLite's is the host's)."""
        return engine(self.alias).clock(self.alias)

    def claims_safely(self) -> bool:
        """Whether workers on several connections can share this database's claims."""
        return engine(self.alias).claims_safely(self.alias)

    def transaction_aborted(self) -> bool:
        """Whether the alias's open transaction refuses statements until rolled back."""
        return engine(self.alias).transaction_aborted(self.alias)

    # ---- enqueue (store/enqueue.py) ----------------------------------------

    def insert(self, job: NewJob) -> EnqueueResult:
        return enqueue.insert(self.jobs, job)

    def insert_many(self, jobs: list[NewJob]) -> list[EnqueueResult]:
        return enqueue.insert_many(self.jobs, jobs)

    # ---- workflows (store/workflows.py, store/parents.py) ------------------

    def insert_after(
        self, job: NewJob, after: Sequence[Parent], on_parent_dead: str = "wait"
    ) -> EnqueueResult:
        return workflows.insert_after(self.jobs, job, after, on_parent_dead)

    def insert_workflow(self, workflow: str, steps: Sequence[Step]) -> list[EnqueueResult]:
        return workflows.insert_workflow(self.jobs, workflow, steps)

    def check_parents_exist(self, after: Sequence[Parent]) -> None:
        parents.check_parents_exist(self.alias, after)

    def parent_results(self, job_id: uuid.UUID) -> dict[str, Any]:
        return workflows.parent_results(self.jobs, job_id)

    def dead_letter_dependents(self, dead: Mapping[str, uuid.UUID]) -> list[DeadLetter]:
        return workflows.dead_letter_dependents(self.jobs, dead)

    def cycles(self, limit: int = 3) -> list[tuple[uuid.UUID, list[str], list[uuid.UUID]]]:
        return parents.cycles(self.alias, limit)

    # ---- the worker (store/claim.py, store/settle.py) ----------------------

    def claim(self, request: ClaimRequest) -> list[ClaimedJob]:
        return claim.claim(self.jobs, request)

    def complete_and_claim(
        self, finished: Sequence[Finished], request: ClaimRequest
    ) -> tuple[Settled, list[ClaimedJob]]:
        return claim.complete_and_claim(self.jobs, finished, request)

    def complete(self, finished: Sequence[Finished]) -> Settled:
        return settle.complete(self.jobs, finished)

    def complete_atomically(self, job: ClaimedJob, result: str | None) -> bool:
        return settle.complete_atomically(self.jobs, job, result)

    def release_dependents(self, keys: Sequence[str]) -> int:
        return settle.release_dependents(self.jobs, keys)

    def retry(self, job: ClaimedJob, *, delay: float, error: dict[str, Any]) -> bool:
        return settle.retry(self.jobs, job, delay=delay, error=error)

    def snooze(self, job: ClaimedJob, *, delay: float) -> bool:
        return settle.snooze(self.jobs, job, delay=delay)

    def release(self, jobs: Iterable[ClaimedJob]) -> int:
        return settle.release(self.jobs, jobs)

    def extend_leases(self, jobs: Iterable[ClaimedJob], seconds: float) -> Leases:
        return settle.extend_leases(self.jobs, jobs, seconds)

    def write_progress(self, job: ClaimedJob, progress: dict[str, Any]) -> bool:
        return settle.write_progress(self.jobs, job, progress)

    def dead_letter(
        self, job: ClaimedJob, *, reason: str, error: dict[str, Any], attempts: int | None = None
    ) -> DeadLetter | None:
        return settle.dead_letter(self.jobs, job, reason=reason, error=error, attempts=attempts)

    def notify_freed(self, keys: Iterable[str]) -> None:
        engine(self.alias).notify_freed(self.alias, keys)

    # ---- operators (store/operators.py) ------------------------------------

    def cancel(self, selection: JobQuerySet, *, by: str = "") -> CancelReport:
        return operators.cancel(selection.using(self.alias), by=by)

    def cancel_workflow(self, workflow: str, *, by: str = "") -> CancelReport:
        return operators.cancel_workflow(self.jobs, workflow, by=by)

    def run_now(self, selection: JobQuerySet) -> int:
        return operators.run_now(selection.using(self.alias))

    def request_cancel(self, selection: JobQuerySet) -> int:
        return operators.request_cancel(selection.using(self.alias))

    def dead_letter_unknown(
        self, name: str, *, before: datetime, message: str, worker: str = "", limit: int = 500
    ) -> list[DeadLetter]:
        return operators.dead_letter_unknown(
            self.jobs, name, before=before, message=message, worker=worker, limit=limit
        )

    # ---- replay (store/replay.py) ------------------------------------------

    def replay(self, letters: DeadLetterQuerySet, request: ReplayRequest) -> ReplayReport:
        return replay.replay(letters.using(self.alias), request)
