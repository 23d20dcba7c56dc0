"""Workflows: jobs that wait for others (docs/workflows.md).

Enqueue with after= (insert_after), a workflow's steps in bulk (insert_workflow),
the dead letters of a dead parent's dependents (dead_letter_dependents) and the
parents' results a step reads (parent_results). Finding parents and refusing
cycles is parents.py's; releasing a finished parent's dependents is the settle's
(settle.release_dependents, the engine's statement).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from functools import partial
from typing import Any, cast

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from django_jobs.attempts import MAX_LABEL, MAX_MESSAGE, DeadReason, error_entry, error_summary
from django_jobs.exceptions import InvalidJob
from django_jobs.models import (
    CompletionMarker,
    DeadLetter,
    Dependency,
    Job,
    JobQuerySet,
    OnParentDead,
)
from django_jobs.payloads import storable_text
from django_jobs.rows import EnqueueResult, NewJob, Parent, Step, definition
from django_jobs.store import enqueue
from django_jobs.store.base import (
    BULK_BATCH,
    DEAD,
    DONE,
    LIVE,
    Found,
    WorkflowRows,
    block,
    duplicate,
    edge,
    release_timing,
)
from django_jobs.store.engine import engine, retrying_deadlocks
from django_jobs.store.parents import find_parent, find_parents, refuse_cycle


def insert_after(
    jobs: JobQuerySet, job: NewJob, after: Sequence[Parent], on_parent_dead: str = "wait"
) -> EnqueueResult:
    """Write a job that runs once every job of `after` has finished, in the open transaction.

    Each parent is found as docs/workflows.md says ("Enqueue with after"): a
    live one counts its new dependent (a row lock held to the caller's
    commit), a finished one counts as done, a dead one (a pending letter,
    locked) counts as unfinished, and a replayed letter is followed to its
    replay. A parent found nowhere raises InvalidJob, and nothing is written.
    With on_parent_dead="dead" and a dead parent the job goes straight to the
    dead letters (parent_dead). A key held by a live or done job makes no
    row and registers nothing: the result is that job's, marked duplicate.
    """
    return retrying_deadlocks(jobs.db, lambda: _insert_after(jobs, job, after, on_parent_dead))


def _insert_after(
    jobs: JobQuerySet, job: NewJob, after: Sequence[Parent], on_parent_dead: str
) -> EnqueueResult:
    alias = jobs.db
    with transaction.atomic(using=alias):
        located = find_parents(alias, dict.fromkeys(after, 1))  # locked in id order
        found = _distinct([located[parent] for parent in after])  # edges in after= order
        _not_after_itself(job, found)
        if job.key is not None:
            refuse_cycle(alias, job.key, lambda: [f.key for f in found if f.state != DONE])
        unfinished = sum(1 for f in found if f.state != DONE)
        dead = next((f for f in found if f.state == DEAD), None)
        now = timezone.now()
        if dead is not None and on_parent_dead == OnParentDead.DEAD:
            holder = _key_holder(alias, job.key) if job.key is not None else None
            if holder is not None:
                transaction.set_rollback(True, using=alias)
                return duplicate(job, *holder, alias)
            _born_dead(job, dead, now).save(using=alias, force_insert=True)
            result = EnqueueResult(job.id, False, job.name, job.queue, now, alias)
        else:
            if unfinished:
                job = block(job)
            result = enqueue.insert(jobs, job)
            if result.duplicate:
                transaction.set_rollback(True, using=alias)  # parents' counts too
                return result
            if unfinished:
                jobs.filter(id=job.id).update(waiting_for=unfinished, **release_timing(job))
        Dependency.objects.using(alias).bulk_create(
            [edge(job.id, f, on_parent_dead, now) for f in found]
        )
        return result


def insert_workflow(jobs: JobQuerySet, workflow: str, steps: Sequence[Step]) -> list[EnqueueResult]:
    """Write a workflow's steps in the open transaction, in bulk; results in step order.

    Steps come in the order they were made, so a step's parents inside the
    workflow come before it: each one's waiting_for and dependents are known
    when it is written, with no round trip per step. Steps without a key go
    in at once (COPY on PostgreSQL, bulk_create elsewhere); a keyed step is
    inserted on its own (dedupe): when its key is held by a live or done job,
    it makes no row and its dependents in the workflow wait for that job.
    Parents outside the workflow are found as by insert_after, once each.
    """
    return retrying_deadlocks(jobs.db, lambda: _insert_workflow(jobs, workflow, steps))


def _insert_workflow(
    jobs: JobQuerySet, workflow: str, steps: Sequence[Step]
) -> list[EnqueueResult]:
    alias = jobs.db
    with transaction.atomic(using=alias):
        named: dict[int, int] = {}  # step index -> steps that name it
        outside: dict[Parent, int] = {}
        for step in steps:
            for parent in step.parents:
                if isinstance(parent, int):
                    named[parent] = named.get(parent, 0) + 1
                else:
                    outside[parent] = outside.get(parent, 0) + 1
        found = find_parents(alias, outside)
        rows = WorkflowRows(workflow, [], [], [], engine(alias).now(alias))
        results = _plan_steps(jobs, steps, named, found, rows)
        engine(alias).write_workflow(jobs, rows)
        DeadLetter.objects.using(alias).bulk_create(rows.letters, batch_size=BULK_BATCH)
        engine(alias).notify(
            alias, {job.queue for job in rows.plain if (job.run_at or rows.now) <= rows.now}
        )
        return results


def _plan_steps(
    jobs: JobQuerySet,
    steps: Sequence[Step],
    named: Mapping[int, int],
    found: Mapping[Parent, Found],
    rows: WorkflowRows,
) -> list[EnqueueResult]:
    """Go through the steps in order: insert each keyed one (dedupe), and add to `rows`
    what is written in bulk after (unkeyed steps, letters, edges). Returns the results."""
    alias, now = jobs.db, rows.now
    # Per step: how the steps after it see it, as a parent.
    seen: list[Found] = []
    results: list[EnqueueResult] = []
    held: dict[int, Found] = {}  # keyed steps a live or done job holds: that job
    for index, step in enumerate(steps):
        parents = _distinct(
            [
                found[parent] if not isinstance(parent, int) else seen[parent]
                for parent in step.parents
            ]
        )
        job = step.job
        _not_after_itself(job, parents)
        if job.key is not None and step.parents:
            refuse_cycle(alias, job.key, partial(_outside_ancestors, steps, index, found, held))
        key = job.key if job.key is not None else str(job.id)
        unfinished = sum(1 for f in parents if f.state != DONE)
        dead = next((f for f in parents if f.state == DEAD), None)
        if dead is not None and step.on_parent_dead == OnParentDead.DEAD:
            holder = _key_holder(alias, job.key) if job.key is not None else None
            if holder is not None:
                results.append(duplicate(job, *holder, alias))
                seen.append(_holder_seen(alias, job, named.get(index, 0), results[-1]))
                held[index] = seen[-1]
                continue
            rows.letters.append(_born_dead(job, dead, now))
            results.append(EnqueueResult(job.id, False, job.name, job.queue, now, alias))
            seen.append(Found(DEAD, key, job.id))
        else:
            job = replace(job, waiting_for=unfinished, dependents=named.get(index, 0))
            if unfinished:
                job = block(job)
            if job.key is None:
                rows.plain.append(job)
                results.append(EnqueueResult(job.id, False, job.name, job.queue, now, alias))
            else:
                result = _insert_step(jobs, job)
                results.append(result)
                if result.duplicate:
                    seen.append(_holder_seen(alias, job, named.get(index, 0), results[-1]))
                    held[index] = seen[-1]
                    continue
            seen.append(Found(LIVE, key, job.id))
        rows.edges.extend((job.id, f, step.on_parent_dead) for f in parents)
        rows.written.append(job)
    return results


def _insert_step(jobs: JobQuerySet, job: NewJob) -> EnqueueResult:
    """Insert a keyed step (dedupe as insert does), then its counts when it has any."""
    result = enqueue.insert(jobs, job)
    if not result.duplicate and (job.waiting_for or job.dependents):
        jobs.filter(id=job.id).update(
            waiting_for=job.waiting_for,
            dependents=F("dependents") + job.dependents,  # on those the insert counted
            **release_timing(job),
        )
    return result


def dead_letter_dependents(jobs: JobQuerySet, parents: Mapping[str, uuid.UUID]) -> list[DeadLetter]:
    """In the caller's transaction: parents (idempotency key -> job id) were just dead-lettered.

    Their blocked dependents whose edge says on_parent_dead="dead" go to the
    dead letters too (parent_dead), and so, recursively, do theirs; "wait"
    ones stay blocked. Called by every path that writes a dead letter, after
    the parent's row is gone: a dependent enqueued meanwhile held that row's
    lock until its commit, so this look sees its edge. One indexed query
    when there are no edges.
    """
    alias = jobs.db
    buried: list[DeadLetter] = []
    while parents:
        edges = (
            Dependency.objects.using(alias)
            .filter(
                parent_key__in=list(parents),
                satisfied_at__isnull=True,
                on_parent_dead=OnParentDead.DEAD,
            )
            .values_list("job_id", "parent_key")
        )
        parent_of: dict[uuid.UUID, str] = {}
        for job_id, parent_key in edges:
            parent_of.setdefault(job_id, parent_key)
        if not parent_of:
            break
        dying = list(
            Job.objects.using(alias)
            .filter(id__in=list(parent_of), locked_by__isnull=True, waiting_for__gt=0)
            .order_by("id")
            .select_for_update()
        )
        if not dying:
            break
        engine(alias).delete_locked(Job.objects.using(alias).filter(id__in=[j.id for j in dying]))
        now = timezone.now()
        letters = []
        for job in dying:
            parent_key = parent_of[job.id]
            error = error_entry(
                job.attempts,
                kind="django_jobs.ParentDead",
                message=f"parent {parent_key} (job {parents[parent_key]}) was dead-lettered",
                at=now,
            )
            letters.append(
                DeadLetter.for_job(job, reason=DeadReason.PARENT_DEAD, error=error, dead_at=now)
            )
        buried += DeadLetter.objects.using(alias).bulk_create(letters)
        # Read under lock: a job without dependents has no edges to follow.
        parents = {
            job.key if job.key is not None else str(job.id): job.id
            for job in dying
            if job.dependents
        }
    return buried


def parent_results(jobs: JobQuerySet, job_id: uuid.UUID) -> dict[str, Any]:
    """The results in the completion markers of a job's parents (docs/workflows.md).

    By the parent's dedupe key; a parent enqueued without one, by its handler's
    name, or "name[i]" (i from 0, in the order of `after=`) when several such
    parents share that name.
    """
    alias = jobs.db
    edges = list(
        Dependency.objects.using(alias)
        .filter(job_id=job_id)
        .order_by("id")
        .values_list("parent_key", "parent_id")
    )
    if not edges:
        return {}
    markers = {
        key: (job, name, result)
        for key, job, name, result in CompletionMarker.objects.using(alias)
        .filter(key__in=[key for key, _ in edges])
        .order_by()
        .values_list("key", "job_id", "name", "result")
    }
    # A parent without a dedupe key is waited for by its id as text: its own, or, once
    # it died and was replayed, its letter's (the replay's marker keeps that key).
    unkeyed = {
        key
        for key, parent in edges
        if key == str(parent) or (key in markers and key == str(markers[key][0]))
    }
    maybe = [i for key, _ in edges if key not in unkeyed and (i := _uuid_or_none(key))]
    if maybe:
        replayed = DeadLetter.objects.using(alias).filter(id__in=maybe, replay_job_id__isnull=False)
        unkeyed.update(str(i) for i in replayed.values_list("id", flat=True))
    found = [(key, key not in unkeyed, markers[key][1:]) for key, _ in edges if key in markers]
    names = Counter(name for _, keyed, (name, _) in found if not keyed)
    seen: Counter[str] = Counter()
    results: dict[str, Any] = {}
    for key, keyed, (name, result) in found:
        if keyed:
            results[key] = result
        elif names[name] == 1:
            results[name] = result
        else:
            results[f"{name}[{seen[name]}]"] = result
            seen[name] += 1
    return results


def _uuid_or_none(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def _not_after_itself(job: NewJob, found: Iterable[Found]) -> None:
    """Refuse a job that would wait for its own key (a dead letter of it): it never runs."""
    if job.key is not None and any(f.key == job.key and f.state == DEAD for f in found):
        raise InvalidJob(
            f"key {job.key!r}: a job cannot wait for a dead letter of its own key "
            "(replay that letter instead)"
        )


def _outside_ancestors(
    steps: Sequence[Step], index: int, found: Mapping[Parent, Found], held: Mapping[int, Found]
) -> set[str]:
    """The keys outside the workflow that step `index` waits for, through earlier steps too.

    A step's parents in the workflow come before it; a keyed step a job outside
    holds (a duplicate) is that job, as its dependents see it.
    """
    keys: set[str] = set()
    stack, visited = [index], {index}
    while stack:
        for parent in steps[stack.pop()].parents:
            if not isinstance(parent, int):
                if found[parent].state != DONE:
                    keys.add(found[parent].key)
            elif parent in held:
                if held[parent].state != DONE:
                    keys.add(held[parent].key)
            elif parent not in visited:
                visited.add(parent)
                stack.append(parent)
    return keys


def _distinct(found: Iterable[Found]) -> list[Found]:
    """One edge per parent key (a job named twice, by id and by key, say)."""
    return list({f.key: f for f in found}.values())


def _key_holder(alias: str, key: str) -> tuple[uuid.UUID, str | None] | None:
    """The (id, fingerprint) of the finished or live job that holds a key, if any."""
    done = CompletionMarker.objects.using(alias).filter(key=key)
    marker = done.values_list("job_id", "fingerprint").first()
    if marker is not None:
        return marker
    return Job.objects.using(alias).filter(key=key).values_list("id", "fingerprint").first()


def _holder_seen(alias: str, job: NewJob, named: int, result: EnqueueResult) -> Found:
    """How the steps naming a duplicate keyed step see it: as the job that holds its key."""
    if not named:
        return Found(DONE, cast(str, job.key), result.id)  # no step waits for it
    return find_parent(alias, Parent(key=job.key), named)


def _born_dead(job: NewJob, parent: Found, now: datetime) -> DeadLetter:
    """The letter of a job whose parent is dead when it is written (on_parent_dead="dead")."""
    error = error_entry(
        0,
        kind="django_jobs.ParentDead",
        message=f"parent {parent.key} (job {parent.id}) is dead-lettered",
        at=now,
    )
    return DeadLetter(
        id=job.id,
        **definition(job),
        attempts=0,
        reason=DeadReason.PARENT_DEAD,
        error=storable_text(error_summary(error), MAX_LABEL + MAX_MESSAGE + 64),
        errors=[error],
        enqueued_at=now,
        dead_at=now,
    )
