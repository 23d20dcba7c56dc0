"""Retention: delete old completion markers and dead letters, a small batch at a time.

Workers prune in their maintenance step (no task to schedule); ``manage.py
prunejobs`` does the same on demand, with ``--dry-run`` to count first. Ages are
measured on the database clock against ``completed_at`` and ``dead_at``.

A marker is the proof that its key's work is done: while a live job holds the
same key (or is the very job the marker records), deleting it would let that job
run the work again. Such markers are never pruned, whatever their age. Nor is a
marker that a live job or a pending dead letter has an edge to (satisfied or
not): that job's ctx.parent_results reads it, and a replay of that letter takes
a missing parent for done. Likewise a pending dead letter that an unsatisfied
edge names is kept until it is replayed (its replay is what releases the job
waiting for it, live or itself a pending letter): without it, a replay of the
waiting letter finds no trace of its parent and runs as if the parent had
succeeded. The workflow rows of a job (its edges and its WorkflowStep row) go
with the last record of it, its marker or its letter; once a waiting letter is
pruned, the letter it waited for becomes prunable in turn.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db.models import Exists, OuterRef, Q
from django.db.models.functions import Now
from django.db.models.lookups import IsNull

from django_jobs import conf, limits

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from django_jobs.models import CompletionMarker, DeadLetter

# Default of the keep_* arguments: read the setting.
SETTINGS: Any = type("FromSettings", (), {"__repr__": lambda self: "SETTINGS"})()


def as_timedelta(value: Any, *, what: str = "retention") -> timedelta | None:
    """Return value as a timedelta, None for 'none' (see limits.duration)."""
    return limits.duration(value, what=what)


@dataclass
class PruneResult:
    markers: int = 0
    dead_letters: int = 0
    batches: int = 0
    dependencies: int = 0  # workflow edges deleted with the last record of their job
    workflow_steps: int = 0  # WorkflowStep rows, likewise

    def __iadd__(self, other: PruneResult) -> PruneResult:
        self.markers += other.markers
        self.dead_letters += other.dead_letters
        self.batches += other.batches
        self.dependencies += other.dependencies
        self.workflow_steps += other.workflow_steps
        return self


def prunable_markers(alias: str, keep: timedelta) -> QuerySet[CompletionMarker]:
    """Markers older than `keep` whose key no live job holds and no waiting job's edge names."""
    from django_jobs.models import CompletionMarker, DeadLetter, Dependency, Job

    live = Job.objects.using(alias).filter(Q(key=OuterRef("key")) | Q(id=OuterRef("job_id")))
    # The edges of a live job or a pending letter (their replay copies them):
    # ctx.parent_results reads the marker, and a replay that finds no trace of
    # a parent takes it for done. Found by parent_key, along its index.
    waiting = Exists(Job.objects.using(alias).filter(id=OuterRef("job_id"))) | Exists(
        DeadLetter.objects.using(alias).filter(id=OuterRef("job_id"), replayed_at__isnull=True)
    )
    named = Dependency.objects.using(alias).filter(waiting, parent_key=OuterRef("key"))
    return (
        CompletionMarker.objects.using(alias)
        .filter(completed_at__lt=Now() - keep)
        .exclude(Exists(live))
        .exclude(Exists(named))
    )


def prunable_dead_letters(alias: str, keep: timedelta) -> QuerySet[DeadLetter]:
    """Dead letters older than `keep`, but pending ones an unsatisfied edge names."""
    from django_jobs.models import DeadLetter, Dependency, letter_edge_key

    # Whoever waits, a live job or a pending letter: a replay of the letter that
    # waits finds no trace of a pruned parent and takes it for done. The edge
    # names the letter's key, or its id as text (along the parent_key index).
    # The letter's own condition sits inside the subquery: a plain NOT EXISTS
    # lets PostgreSQL plan an anti-join.
    waited = Dependency.objects.using(alias).filter(
        IsNull(OuterRef("replayed_at"), True),
        satisfied_at__isnull=True,
        parent_key=letter_edge_key(OuterRef),
    )
    return DeadLetter.objects.using(alias).filter(dead_at__lt=Now() - keep).exclude(Exists(waited))


def _forget_workflow_rows(alias: str, ids: list[Any]) -> tuple[int, int]:
    """Delete the edges and WorkflowStep rows of jobs of which no record is left; count them."""
    from django_jobs.models import CompletionMarker, DeadLetter, Dependency, Job, WorkflowStep

    markers = CompletionMarker.objects.using(alias).filter(job_id__in=ids).values("job_id")
    letters = DeadLetter.objects.using(alias).filter(id__in=ids).values("id")
    live = Job.objects.using(alias).filter(id__in=ids).values("id")
    edges, steps = (
        model.objects.using(alias)
        .filter(job_id__in=ids)
        .exclude(job_id__in=markers)
        .exclude(job_id__in=letters)
        .exclude(job_id__in=live)
        .delete()[0]
        for model in (Dependency, WorkflowStep)
    )
    return edges, steps


def count_workflow_rows(
    alias: str,
    markers: QuerySet[CompletionMarker] | None,
    letters: QuerySet[DeadLetter] | None,
) -> tuple[int, int]:
    """Count the edges and WorkflowStep rows that pruning these markers and letters deletes.

    None: that table is not pruned. A job's rows go with its last record
    (_forget_workflow_rows): they count when a record of the job is among these
    and neither the job itself nor another record of it stays.
    """
    from django_jobs.models import CompletionMarker, DeadLetter, Dependency, Job, WorkflowStep

    pruned = Q()
    stays = Q(job_id__in=Job.objects.using(alias).values("id"))
    every_marker = CompletionMarker.objects.using(alias).values("job_id")
    every_letter = DeadLetter.objects.using(alias).values("id")
    if markers is None:
        stays |= Q(job_id__in=every_marker)
    else:
        pruned |= Q(job_id__in=markers.values("job_id"))
        stays |= Q(job_id__in=every_marker) & ~Q(job_id__in=markers.values("job_id"))
    if letters is None:
        stays |= Q(job_id__in=every_letter)
    else:
        pruned |= Q(job_id__in=letters.values("id"))
        stays |= Q(job_id__in=every_letter) & ~Q(job_id__in=letters.values("id"))
    if not pruned:
        return 0, 0
    edges, steps = (
        model.objects.using(alias).filter(pruned).exclude(stays).count()
        for model in (Dependency, WorkflowStep)
    )
    return edges, steps


def _delete_batch(queryset: QuerySet[Any], pk: str, order: str, batch: int) -> tuple[int, int, int]:
    """Delete one batch; return how many rows, edges and WorkflowStep rows went."""
    # Two statements: pick the oldest ids along the age index, then delete those
    # still eligible (the same conditions, re-checked at delete time).
    ids = list(queryset.order_by(order).values_list(pk, flat=True)[:batch])
    if not ids:
        return 0, 0, 0
    deleted, _ = queryset.filter(**{f"{pk}__in": ids}).delete()
    edges, steps = _forget_workflow_rows(queryset.db, ids) if deleted else (0, 0)
    return deleted, edges, steps


def prune_batch(
    alias: str | None = None,
    *,
    keep_markers: Any = SETTINGS,
    keep_dead_letters: Any = SETTINGS,
    batch: int | None = None,
) -> PruneResult:
    """Delete at most one batch of old markers and one of old dead letters."""
    return _prune_batch(_plan(alias, keep_markers, keep_dead_letters, batch))


def prune(
    alias: str | None = None,
    *,
    keep_markers: Any = SETTINGS,
    keep_dead_letters: Any = SETTINGS,
    batch: int | None = None,
    budget: float | None = None,
) -> PruneResult:
    """Prune in batches until nothing is left (or `budget` seconds have passed)."""
    plan = _plan(alias, keep_markers, keep_dead_letters, batch)
    total = PruneResult()
    deadline = None if budget is None else time.monotonic() + budget
    while True:
        result = _prune_batch(plan)
        total += result
        if result.markers < plan.batch and result.dead_letters < plan.batch:
            return total
        if result.markers < plan.batch:  # done with markers; finish the dead letters
            plan = replace(plan, keep_markers=None)
        if result.dead_letters < plan.batch:
            plan = replace(plan, keep_dead_letters=None)
        if deadline is not None and time.monotonic() >= deadline:
            return total


@dataclass(frozen=True)
class _Plan:
    alias: str
    keep_markers: timedelta | None  # None: leave markers alone
    keep_dead_letters: timedelta | None
    batch: int


def _plan(alias: str | None, keep_markers: Any, keep_dead_letters: Any, batch: int | None) -> _Plan:
    """Resolve prune's arguments against the settings once."""
    alias = alias or conf.database()
    size = limits.integer("batch", batch or conf.get("PRUNE_BATCH"), 1, limits.MAX_INT)
    keep_markers, keep_dead_letters = _keeps(keep_markers, keep_dead_letters)
    return _Plan(alias, keep_markers, keep_dead_letters, size)


def _prune_batch(plan: _Plan) -> PruneResult:
    result = PruneResult()
    if plan.keep_markers is not None:
        markers = prunable_markers(plan.alias, plan.keep_markers)
        result.markers, edges, steps = _delete_batch(markers, "job_id", "completed_at", plan.batch)
        result += PruneResult(batches=1, dependencies=edges, workflow_steps=steps)
    if plan.keep_dead_letters is not None:
        letters = prunable_dead_letters(plan.alias, plan.keep_dead_letters)
        result.dead_letters, edges, steps = _delete_batch(letters, "id", "dead_at", plan.batch)
        result += PruneResult(batches=1, dependencies=edges, workflow_steps=steps)
    return result


def count_prunable(
    alias: str | None = None,
    *,
    keep_markers: Any = SETTINGS,
    keep_dead_letters: Any = SETTINGS,
) -> PruneResult:
    """Count what prune() would delete now, workflow rows included (for --dry-run)."""
    alias = alias or conf.database()
    keep_markers, keep_dead_letters = _keeps(keep_markers, keep_dead_letters)
    markers = None if keep_markers is None else prunable_markers(alias, keep_markers)
    letters = None if keep_dead_letters is None else prunable_dead_letters(alias, keep_dead_letters)
    edges, steps = count_workflow_rows(alias, markers, letters)
    return PruneResult(
        markers=0 if markers is None else markers.count(),
        dead_letters=0 if letters is None else letters.count(),
        dependencies=edges,
        workflow_steps=steps,
    )


def _keeps(keep_markers: Any, keep_dead_letters: Any) -> tuple[timedelta | None, timedelta | None]:
    if keep_markers is SETTINGS:
        keep_markers = conf.get("KEEP_MARKERS")
    if keep_dead_letters is SETTINGS:
        keep_dead_letters = conf.get("KEEP_DEAD_LETTERS")
    return (
        as_timedelta(keep_markers, what="KEEP_MARKERS"),
        as_timedelta(keep_dead_letters, what="KEEP_DEAD_LETTERS"),
    )
