"""Replay: giving dead letters new live jobs (docs/admin.md, docs/workflows.md "Replay").

control.replay is the public entry (it hands over the registry's handlers); here,
each batch of letters is one transaction of a few statements whatever its size:
lock the letters, read their edges, look their keys up, find their parents, insert
the jobs (the engine's insert_replays), copy the edges, mark the letters (the
engine's mark_replayed).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any, NamedTuple, cast

from django.db import connections, models, transaction
from django.db.models import F, Q
from django.utils import timezone

from django_jobs import flow, limits, tracing
from django_jobs.exceptions import InvalidJob
from django_jobs.limits import MAX_BY_LENGTH
from django_jobs.models import CompletionMarker, DeadLetter, DeadLetterQuerySet, Dependency, Job
from django_jobs.payloads import fingerprint as payload_fingerprint
from django_jobs.rows import NewJob, Parent, ReplayReport, ReplayRequest, uuid7
from django_jobs.store.base import (
    DEAD,
    DEDUPE_ROUNDS,
    DONE,
    EDGE_BATCH,
    EXISTS_BATCH,
    LIVE,
    ById,
    Found,
    KeyRaced,
    block,
    chunks,
)
from django_jobs.store.engine import engine, retrying_deadlocks

# Dead letters replayed per transaction: few commits and one NOTIFY per queue per
# batch, without one huge transaction. Each batch is a few statements, whatever
# its size (_replay_letters).
REPLAY_BATCH = 1000


class _ReplayCycles(Exception):
    """Letters of a replay chunk whose jobs would wait for their own waiters (refuse_cycle)."""

    def __init__(self, letters: set[uuid.UUID]) -> None:
        super().__init__(letters)
        self.letters = letters


def replay(letters: DeadLetterQuerySet, request: ReplayRequest) -> ReplayReport:
    """Give each selected letter one new live job: same name, payload, queue, priority, key.

    The new job starts with no attempts, due now (or at `run_at`, or `delay`
    from now on the database clock). The letter records when, by whom, and the
    new job's id; a letter already replayed (now, or by a concurrent call) is
    left alone, so replaying twice never makes a second job. A letter whose key
    a live job holds, or whose key's work has completed since, is not replayed;
    nor is one whose name is not in `request.partition_by` (no such handler).
    Letters are replayed REPLAY_BATCH at a time, each batch in one transaction
    of a few statements whatever its size (_replay_letters);
    `request.progress(done, total)` is called after each batch.
    """
    alias = letters.db
    report = ReplayReport()
    ids = list(letters.values_list("id", flat=True))
    done = 0
    size = REPLAY_BATCH
    if limit := connections[alias].features.max_query_params:
        size = max(1, min(size, limit // 3))  # SQLite: a CASE of 2 per letter, an IN of 1
    # Each new job due now wakes listening workers at commit (see enqueue.insert).
    for chunk in chunks(ids, size):
        report.add(_replay_chunk(alias, chunk, request))
        done += len(chunk)
        if request.progress is not None:
            request.progress(done, len(ids))
    return report


def replay_request(
    *,
    by: str,
    run_at: datetime | None,
    delay: float | timedelta | None,
    partition_by: Mapping[str, Any],
    progress: Any = None,
) -> ReplayRequest:
    """Check a replay's run_at and delay (ValueError, InvalidJob) and make its request."""
    if run_at is not None and delay is not None:
        raise ValueError("pass run_at or delay, not both")
    if run_at is not None:
        limits.run_time("run_at", run_at)
    seconds = 0.0
    if delay is not None:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
        seconds = limits.seconds("delay", seconds, zero=True)
    return ReplayRequest(by, run_at, seconds, partition_by, progress)


class _Letter(NamedTuple):
    """The fields of a dead letter its replay reads (_REPLAYED)."""

    id: uuid.UUID
    name: str
    queue: str
    payload: str
    priority: int
    max_attempts: int
    key: str | None
    fingerprint: str | None
    replayed_at: datetime | None
    trace_context: str | None
    tags: list[str] | None
    meta: dict[str, str] | None

    @property
    def edge_key(self) -> str:
        """The key its dependents' edges name it by: its key, or its id as text."""
        return self.key if self.key is not None else str(self.id)


_REPLAYED = _Letter._fields


class _Edge(NamedTuple):
    """A Dependency row as a replay reads it."""

    id: int
    job_id: uuid.UUID
    parent_key: str
    parent_id: uuid.UUID
    on_parent_dead: str
    satisfied_at: datetime | None


def _replay_chunk(alias: str, chunk: list[uuid.UUID], request: ReplayRequest) -> ReplayReport:
    """Replay the letters of chunk in one transaction, again when it lost a race or a deadlock."""
    cyclic: set[uuid.UUID] = set()
    for _round in range(DEDUPE_ROUNDS + len(chunk)):
        # A replay locks its letters, then their parents: out of id order, so InnoDB
        # may pick it as a deadlock's victim; its chunk is then tried again whole.
        rest = [letter for letter in chunk if letter not in cyclic]
        replay = partial(_replay_letters, alias, rest, request)
        try:
            report = retrying_deadlocks(alias, replay) if rest else ReplayReport()
        except KeyRaced:
            continue  # a key changed hands between the look and the insert: look again
        except _ReplayCycles as found:
            cyclic |= found.letters  # rolled back: the chunk again without them
            continue
        report.cycles += sorted(cyclic)
        return report
    raise InvalidJob("replay: the keys of these letters keep changing hands; try again")


def _replay_letters(alias: str, chunk: list[uuid.UUID], request: ReplayRequest) -> ReplayReport:
    """Replay the letters of chunk in one transaction; return what it did.

    A few statements for the chunk, none per letter: lock the letters (in id
    order, as every path that locks several rows), read their edges, look their
    keys up, find the parents of their own edges (only when they have some),
    insert the jobs, copy the edges, move the workflow steps, mark the letters.
    """
    report = ReplayReport()
    with transaction.atomic(using=alias):
        rows = (
            DeadLetter.objects.using(alias)
            .filter(id__in=chunk)
            .order_by("id")
            .select_for_update()
            .values_list(*_REPLAYED)
        )
        letters: list[_Letter] = []
        for row in rows:
            letter = _Letter(*row)
            # Locked, so replayed_at is current: a concurrent replay of it has committed.
            if letter.replayed_at is not None:
                report.already.append(letter.id)
            elif letter.name not in request.partition_by:
                report.unknown.append(letter.id)
            else:
                letters.append(letter)
        if not letters:
            return report
        own, waiting = _replay_edges_of(alias, letters)
        jobs = _replay_jobs(alias, letters, waiting, request, report)
        if not jobs:
            return report
        copies, live = _copy_replayed_edges(alias, own, jobs)
        _refuse_replay_cycles(alias, jobs, copies)
        engine(alias).insert_replays(Job.objects.using(alias), list(jobs.values()))
        if copies:
            Dependency.objects.using(alias).bulk_create(copies, batch_size=EDGE_BATCH)
        # The live parents the copies wait for (locked) count their new dependents.
        for part in chunks(sorted(live), EXISTS_BATCH):
            counts = {job_id: live[job_id] for job_id in part}
            Job.objects.using(alias).filter(id__in=part).update(
                dependents=F("dependents") + ById("id", counts, models.IntegerField())
            )
        engine(alias).mark_replayed(alias, jobs, request.by[:MAX_BY_LENGTH])
        report.replayed.update((letter, job.id) for letter, job in jobs.items())
    return report


def _refuse_replay_cycles(
    alias: str, jobs: Mapping[uuid.UUID, NewJob], copies: Sequence[Dependency]
) -> None:
    """Raise _ReplayCycles for the letters whose replays would wait for their own waiters.

    A job of the key enqueued after one of the letter's waiters (and cancelled,
    say) left the letter waiting for it: replayed, it would wait for itself. One
    walk down from every key of the chunk together, as _waiting_for walks from one
    (the same locks): a few statements a level, not per letter.
    """
    waited: dict[uuid.UUID, set[str]] = {}
    for copy in copies:
        if copy.satisfied_at is None:
            waited.setdefault(copy.job_id, set()).add(copy.parent_key)
    sources = {
        job.key: letter
        for letter, job in jobs.items()
        if job.key is not None and job.dependents and job.id in waited
    }
    if not sources:
        return  # no waiters, or no unfinished parents: no cycle through them
    letters = DeadLetter.objects.using(alias).pending().select_for_update()
    rows = Job.objects.using(alias).select_for_update()
    edges = Dependency.objects.using(alias).filter(satisfied_at__isnull=True)
    below: dict[str, set[str]] = {}  # a key that waits for sources' keys: those keys
    frontier: dict[str, set[str]] = {key: {key} for key in sources}
    while frontier:
        waits: dict[uuid.UUID, set[str]] = {}
        for part in chunks(sorted(frontier), EXISTS_BATCH):
            found = edges.filter(parent_key__in=part).values_list("job_id", "parent_key")
            for job_id, parent_key in found:
                waits.setdefault(job_id, set()).update(frontier[parent_key])
        frontier = {}
        for part in chunks(sorted(waits), EXISTS_BATCH):
            for model in (rows, letters):
                for node_id, node_key in (
                    model.filter(id__in=part).order_by("id").values_list("id", "key")
                ):
                    key = node_key if node_key is not None else str(node_id)
                    new = waits[node_id] - below.get(key, set())
                    if new:
                        below.setdefault(key, set()).update(new)
                        frontier.setdefault(key, set()).update(new)
    cyclic = {
        letter
        for key, letter in sources.items()
        if any(key in below.get(parent, ()) for parent in waited[jobs[letter].id])
    }
    if cyclic:
        raise _ReplayCycles(cyclic)


def _replay_edges_of(
    alias: str, letters: list[_Letter]
) -> tuple[dict[uuid.UUID, list[_Edge]], Counter[str]]:
    """Return the letters' own edges (by letter, in id order) and the unsatisfied edges
    that wait for each letter's key (by key), in one query.

    Read after the letters are locked: an enqueue that found a letter pending held
    its lock until its edge committed, so the count sees that edge; later ones
    follow replay_job_id to the new job.
    """
    edges = (
        Dependency.objects.using(alias)
        .filter(
            Q(job_id__in=[letter.id for letter in letters])
            | Q(parent_key__in=[letter.edge_key for letter in letters], satisfied_at__isnull=True)
        )
        .order_by("id")
        .values_list(*_Edge._fields)
    )
    ids = {letter.id for letter in letters}
    keys = {letter.edge_key for letter in letters}
    own: dict[uuid.UUID, list[_Edge]] = {}
    waiting: Counter[str] = Counter()
    for row in edges:
        edge = _Edge(*row)
        if edge.job_id in ids:
            own.setdefault(edge.job_id, []).append(edge)
        if edge.satisfied_at is None and edge.parent_key in keys:
            waiting[edge.parent_key] += 1
    return own, waiting


def _replay_jobs(
    alias: str,
    letters: list[_Letter],
    waiting: Counter[str],
    request: ReplayRequest,
    report: ReplayReport,
) -> dict[uuid.UUID, NewJob]:
    """Return the new job of each letter whose key is free (by letter id, in id order).

    A letter whose key has unsatisfied edges gives its job that key (its id as
    text, when it has no dedupe key), so that the job's marker satisfies them. A
    key with a completion marker, or held by a live job or by an earlier letter of
    the chunk, makes no job: the letter goes to report.completed or key_taken.
    """
    jobs: dict[uuid.UUID, NewJob] = {}
    for letter in letters:
        count = waiting[letter.edge_key]
        key, fingerprint = letter.key, letter.fingerprint
        if count:  # its dependents wait for its key: the new job's marker must carry it
            key, fingerprint = letter.edge_key, _letter_fingerprint(letter)
        jobs[letter.id] = NewJob(
            id=uuid7(),
            name=letter.name,
            queue=letter.queue,
            payload=letter.payload,
            priority=letter.priority,
            run_at=request.run_at,
            delay=request.delay,
            max_attempts=letter.max_attempts,
            key=key,
            fingerprint=fingerprint,
            partition=_partition_of(request, letter.name, letter.payload),
            dependents=count,
            tags=letter.tags,
            meta=letter.meta,
        )
    tracing.replayed(letters, jobs)
    keys = [job.key for job in jobs.values() if job.key is not None]
    completed: set[str | None] = set()
    live: set[str | None] = set()
    if keys:
        markers = CompletionMarker.objects.using(alias).filter(key__in=keys)
        completed = set(markers.values_list("key", flat=True))
        live = set(Job.objects.using(alias).filter(key__in=keys).values_list("key", flat=True))
    for letter in letters:
        key = jobs[letter.id].key
        if key is None:
            continue
        if key in completed or key in live:
            del jobs[letter.id]
            (report.completed if key in completed else report.key_taken).append(letter.id)
        else:
            live.add(key)  # a later letter of the key finds it held by this one's job
    return jobs


def _copy_replayed_edges(
    alias: str, own: dict[uuid.UUID, list[_Edge]], jobs: dict[uuid.UUID, NewJob]
) -> tuple[list[Dependency], Counter[uuid.UUID]]:
    """Copy the replayed letters' own edges to their new jobs (docs/workflows.md "Replay").

    A parent finished since (its marker, or no trace left) counts as done; the
    others are found as an enqueue finds them (_find_replayed_parents). A job
    with unfinished parents is written blocked, with the replay's run_at or delay
    for its release. The jobs of the chunk count the copies that wait for their
    keys as dependents. Returns the copies, and the live parents they wait for
    with how many each.
    """
    edges = [edge for letter in jobs for edge in own.get(letter, ())]
    if not edges:
        return [], Counter()
    markers = CompletionMarker.objects.using(alias)
    open_keys = {edge.parent_key for edge in edges if edge.satisfied_at is None}
    finished: set[str] = set()
    for part in chunks(sorted(open_keys), EXISTS_BATCH):
        finished.update(markers.filter(key__in=part).values_list("key", flat=True))

    def parent_of(edge: _Edge) -> Parent | None:
        if edge.satisfied_at is not None or edge.parent_key in finished:
            return None
        return Parent(id=edge.parent_id, key=edge.parent_key)

    found = _find_replayed_parents(alias, {p for e in edges if (p := parent_of(e)) is not None})
    now = timezone.now()
    copies: list[Dependency] = []
    live: Counter[uuid.UUID] = Counter()
    for letter, job in list(jobs.items()):
        waiting_for = 0
        for edge in own.get(letter, ()):
            parent = parent_of(edge)
            where = found.get(parent) if parent is not None else None
            unfinished = where is not None and where.state != DONE
            copies.append(
                Dependency(
                    job_id=job.id,
                    parent_key=edge.parent_key,
                    parent_id=edge.parent_id if where is None else where.id,
                    on_parent_dead=edge.on_parent_dead,
                    created_at=now,
                    satisfied_at=None if unfinished else (edge.satisfied_at or now),
                )
            )
            if unfinished:
                waiting_for += 1
            if where is not None and where.state == LIVE:
                live[where.id] += 1
        if waiting_for:
            # The replay's run_at or delay, if given, apply from its release.
            jobs[letter] = block(replace(job, waiting_for=waiting_for))
    holder = {job.key: job for job in jobs.values() if job.key is not None}
    for copy in copies:
        if copy.satisfied_at is None and copy.parent_key in holder:
            holder[copy.parent_key].dependents += 1  # a parent replayed in the same chunk
    return copies, live


def _find_replayed_parents(alias: str, parents: Collection[Parent]) -> dict[Parent, Found | None]:
    """Find the parents of replayed edges as find_parent does, a few statements per round.

    Each round looks up every parent still unfound by id (_look_by_id) or by key
    (_look_by_key), together; a replayed letter is followed to its replay in the
    next round. It only locks: the caller counts the new dependents of the live
    parents it keeps. None: found nowhere (its marker pruned), which counts as done.
    """
    found: dict[Parent, Found | None] = {}
    looking: dict[Parent, uuid.UUID | None] = {p: p.id for p in parents}  # None: by key
    for _round in range(2 * DEDUPE_ROUNDS):
        if not looking:
            break
        by_id = {parent: job_id for parent, job_id in looking.items() if job_id is not None}
        by_key = [parent for parent, job_id in looking.items() if job_id is None]
        looking = {}
        # In parts of EXISTS_BATCH: a fan-in step may wait for 100,000 parents.
        for part in chunks(list(by_id.items()), EXISTS_BATCH):
            looking.update(_look_by_id(alias, dict(part), found))
        for keyed in chunks(by_key, EXISTS_BATCH):
            looking.update(_look_by_key(alias, keyed, found))
    found.update(dict.fromkeys(looking))  # still moving after every round: as not found
    return found


def _look_by_id(
    alias: str, by_id: Mapping[Parent, uuid.UUID], found: dict[Parent, Found | None]
) -> dict[Parent, uuid.UUID | None]:
    """Find parents by job id: live (locked), then a marker, then a letter (locked), each
    kind in one statement; return those to look for again (a replay's id, or None: by key)."""
    rest = set(by_id.values())
    live = dict(
        Job.objects.using(alias)
        .filter(id__in=rest)
        .order_by("id")  # locked in id order, as every path that locks several rows
        .select_for_update()
        .values_list("id", "key")
    )
    rest -= live.keys()
    markers = CompletionMarker.objects.using(alias).filter(job_id__in=rest)
    marked = dict(markers.values_list("job_id", "key"))
    rest -= marked.keys()
    dead = {
        letter_id: (key, replay)
        for letter_id, key, replay in DeadLetter.objects.using(alias)
        .filter(id__in=rest)
        .order_by("id")
        .select_for_update()
        .values_list("id", "key", "replay_job_id")
    }
    again: dict[Parent, uuid.UUID | None] = {}
    for parent, job_id in by_id.items():
        if job_id in live:
            own = live[job_id]
            found[parent] = Found(LIVE, own if own is not None else str(job_id), job_id)
        elif job_id in marked:
            found[parent] = Found(DONE, marked[job_id], job_id)
        elif job_id in dead:
            letter_key, replay = dead[job_id]
            if replay is None:
                key = letter_key if letter_key is not None else str(job_id)
                found[parent] = Found(DEAD, key, job_id)
            else:
                again[parent] = replay  # replayed: its replay is the job to wait for
        elif parent.key is not None and job_id == parent.id:
            again[parent] = None  # an id's text given as a string may be a dedupe key too
        else:
            found[parent] = None
    return again


def _look_by_key(
    alias: str, by_key: Sequence[Parent], found: dict[Parent, Found | None]
) -> dict[Parent, uuid.UUID | None]:
    """Find parents by key: a live holder (locked by id alone, as find_parent does), then a
    marker, then the latest pending letter (letters locked by id, in id order); return
    those to look for again (every letter of the key replayed: its job is live or done)."""
    jobs = Job.objects.using(alias)
    letters = DeadLetter.objects.using(alias)
    keys = {cast(str, parent.key) for parent in by_key}
    holders: dict[str | None, uuid.UUID] = dict(jobs.filter(key__in=keys).values_list("key", "id"))
    locked = set(
        jobs.filter(id__in=list(holders.values()))
        .order_by("id")
        .select_for_update()
        .values_list("id", flat=True)
    )
    held = {key for key, job_id in holders.items() if job_id in locked}
    markers = CompletionMarker.objects.using(alias).filter(key__in=keys - held)
    marked: dict[str, uuid.UUID] = dict(markers.values_list("key", "job_id"))
    rest = keys - held - marked.keys()
    letter_ids = list(letters.filter(key__in=rest).order_by().values_list("id", flat=True))
    of_key: dict[str | None, list[tuple[datetime, uuid.UUID]]] = {}  # pending ones, by key
    for letter_id, key, replay, dead_at in (
        letters.filter(id__in=letter_ids, key__in=rest)
        .order_by("id")
        .select_for_update()
        .values_list("id", "key", "replay_job_id", "dead_at")
    ):
        of_key.setdefault(key, [])
        if replay is None:
            of_key[key].append((dead_at, letter_id))
    again: dict[Parent, uuid.UUID | None] = {}
    for parent in by_key:
        key = cast(str, parent.key)
        if key in held:
            found[parent] = Found(LIVE, key, holders[key])
        elif key in marked:
            found[parent] = Found(DONE, key, marked[key])
        elif of_key.get(key):
            latest = max(of_key[key], key=lambda letter: (letter[0], -letter[1].int))
            found[parent] = Found(DEAD, key, latest[1])
        elif key in of_key:
            again[parent] = None
        else:
            found[parent] = None
    return again


def _letter_fingerprint(letter: _Letter) -> str | None:
    if letter.fingerprint is not None:
        return letter.fingerprint
    try:
        return payload_fingerprint(letter.name, letter.payload)
    except ValueError:  # a hand-edited payload that is no JSON: no fingerprint to compare
        return None


def _partition_of(request: ReplayRequest, name: str, payload: str) -> str | None:
    """Return the partition of a replayed payload under its handler's partition_by, if any."""
    partition_by = request.partition_by.get(name)
    if partition_by is None:
        return None
    try:
        return flow.partition_of(name, partition_by, json.loads(payload))
    except (InvalidJob, ValueError):
        return None  # the letter's payload no longer partitions: its own partition (NULL)
