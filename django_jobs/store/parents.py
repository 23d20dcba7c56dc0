"""Workflows' parents: finding the jobs an enqueue waits for, and refusing cycles.

Every path that locks several jobs does it in id order (find_parents, a settle,
a replay): see docs/workflows.md "Cycles" and "Enqueue with after".
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from django.db.models import Exists, F, OuterRef

from django_jobs.exceptions import InvalidJob
from django_jobs.models import CompletionMarker, DeadLetter, Dependency, Job
from django_jobs.rows import Parent
from django_jobs.store.base import DEAD, DEDUPE_ROUNDS, DONE, EXISTS_BATCH, LIVE, Found, chunks


def find_parents(alias: str, counts: Mapping[Parent, int]) -> dict[Parent, Found]:
    """Find each parent (with its count of new dependents), locking the rows in id order.

    Every path that locks several jobs does it in id order: this one, a settle
    (sql.COMPLETE_RELEASING locks a batch and the jobs it releases together,
    _id_order) and a replay. A parent named by key is first looked up without a
    lock, for the id of the row it will lock: two enqueues that name the same
    parents, one by id and one by key, then wait for each other instead of each
    holding what the other needs (a deadlock).
    """
    if len(counts) < 2:
        return {parent: find_parent(alias, parent, count) for parent, count in counts.items()}
    by_key = [p.key for p in counts if p.id is None and p.key is not None]
    row_of: dict[str | None, uuid.UUID] = {}
    if by_key:
        letters = DeadLetter.objects.using(alias).filter(key__in=by_key).order_by("-id")
        row_of.update(letters.values_list("key", "id"))  # the lowest id of each key wins
        row_of.update(Job.objects.using(alias).filter(key__in=by_key).values_list("key", "id"))
    # An id first (a key with no row locks nothing, or only markers: last).
    unseen = uuid.UUID(int=(1 << 128) - 1)

    def position(parent: Parent) -> tuple[uuid.UUID, str]:
        row = parent.id if parent.id is not None else row_of.get(parent.key, unseen)
        return row, parent.key or ""

    return {
        parent: find_parent(alias, parent, counts[parent])
        for parent in sorted(counts, key=position)
    }


def find_parent(alias: str, parent: Parent, count: int = 1) -> Found:
    """Find a parent in the caller's transaction; a live one gets `count` more dependents.

    The UPDATE of a live parent takes its row lock until the caller commits: a
    settle of that row waits, then sees this edge (docs/workflows.md). A pending
    letter is locked so that a concurrent replay waits for the edge too.
    """
    jobs = Job.objects.using(alias)
    markers = CompletionMarker.objects.using(alias)
    letters = DeadLetter.objects.using(alias)
    job_id, key = parent.id, parent.key
    for _round in range(2 * DEDUPE_ROUNDS):
        if job_id is not None:
            if jobs.filter(id=job_id).update(dependents=F("dependents") + count):
                own = jobs.filter(id=job_id).values_list("key", flat=True).first()
                return Found(LIVE, own if own is not None else str(job_id), job_id)
            marked = markers.filter(job_id=job_id).values_list("key", flat=True).first()
            if marked is not None:
                return Found(DONE, marked, job_id)
            letter = (
                letters.filter(id=job_id).select_for_update().values_list("key", "replay_job_id")
            ).first()
            if letter is not None:
                letter_key, replay = letter
                if replay is None:
                    dead_key = letter_key if letter_key is not None else str(job_id)
                    return Found(DEAD, dead_key, job_id)
                job_id = replay  # replayed: its replay is the job to wait for
                continue
            if key is None or parent.id is None or job_id != parent.id:
                break
            job_id = None  # an id's text given as a string may be a dedupe key too
            continue
        assert key is not None  # noqa: S101 - a Parent has an id or a key
        holder = jobs.filter(key=key).values_list("id", flat=True).first()
        # By id alone: with its key too, InnoDB may take the key's index entry
        # first, which a settle deleting the row needs after locking it (a deadlock).
        if holder is not None and jobs.filter(id=holder).update(dependents=F("dependents") + count):
            return Found(LIVE, key, holder)
        marked_id = markers.filter(key=key).values_list("job_id", flat=True).first()
        if marked_id is not None:
            return Found(DONE, key, marked_id)
        # The key's letters by id, then locked by id: a letter's key is in no index,
        # and InnoDB's locking read by key scans the table, waiting for every row
        # another transaction holds (out of id order: a deadlock with an enqueue or
        # a replay that holds a letter further on and waits for one this one holds).
        letter_ids = list(letters.filter(key=key).order_by().values_list("id", flat=True))
        dead = list(  # locked in id order, as every path that locks several rows
            letters.filter(id__in=letter_ids, key=key)
            .order_by("id")
            .select_for_update()
            .values_list("id", "replay_job_id", "dead_at")
        )
        pending = [(dead_at, letter_id) for letter_id, replay, dead_at in dead if replay is None]
        if pending:
            latest = max(pending, key=lambda letter: (letter[0], -letter[1].int))
            return Found(DEAD, key, latest[1])
        if not dead:
            break
        # Every letter of the key was replayed, maybe just now: its job is live or done.
    raise _no_such_parent(parent)


def _no_such_parent(parent: Parent) -> InvalidJob:
    return InvalidJob(f"after: no such job {parent} (not live, finished or dead-lettered)")


def check_parents_exist(alias: str, parents: Sequence[Parent]) -> None:
    """Raise InvalidJob for the first parent found nowhere, reading only: no lock, no count.

    A parent exists when a live job, a completion marker or a dead letter holds
    its id, or its key (an id's text given as a string: either); a letter
    counts replayed or not (the write follows it to its replay). The ids are
    read in one statement, then the keys of the parents still unfound in one.
    For enqueue_on_commit(commit_of=...), which writes the job later: a missing
    parent is refused from the call, while the caller's transaction can still
    roll back. find_parent, at the write, stays the lookup that decides.
    """
    found_ids = _held(alias, "id", [p.id for p in parents if p.id is not None])
    unfound = [p.key for p in parents if p.key is not None and p.id not in found_ids]
    found_keys = _held(alias, "key", unfound)
    for parent in parents:
        if parent.id not in found_ids and parent.key not in found_keys:
            raise _no_such_parent(parent)


def _held(alias: str, column: str, values: list[Any]) -> set[Any]:
    """Which of values ("id"s or "key"s) a live job, a marker or a dead letter holds."""
    marker = "job_id" if column == "id" else column
    found: set[Any] = set()
    for chunk in chunks(list(dict.fromkeys(values)), EXISTS_BATCH):
        jobs, markers, letters = (
            model._default_manager.using(alias)
            .filter(**{f"{name}__in": chunk})
            .order_by()  # no Meta.ordering: a UNION takes none, inside or around it
            .values_list(name, flat=True)
            for model, name in ((Job, column), (CompletionMarker, marker), (DeadLetter, column))
        )
        found.update(jobs.union(markers, letters, all=True).order_by())
    return found


def _waiting_for(
    alias: str, key: str, *, lock: bool = True, dead_key: bool = False
) -> dict[str, str]:
    """The keys of the jobs and pending letters that wait for `key`, directly or not.

    Each maps to the key it waits for on its way to `key` (to name a cycle);
    `key` itself is among them when a job of it waits for itself already. A
    downward walk along the parent_key index, one level at a time, each row
    locked before its waiters are read: the key's pending letters first, then
    the waiters found, live jobs and pending letters (their replays wait again),
    by id. An enqueue that registers a waiter on one of them (it locks the job
    it waits for, or the letters of its key) is then either seen here or waits
    for this transaction, and its own walk sees this one's edges: two
    transactions cannot each build half of a cycle (docs/workflows.md "Cycles").
    One indexed query when the key has no pending letter (the usual case).
    Without `lock`, a look that locks nothing (jobs status); with `dead_key`, the
    key is a letter's being replayed (no longer pending in this transaction).
    """
    letters = DeadLetter.objects.using(alias).pending()
    jobs = Job.objects.using(alias)
    edges = Dependency.objects.using(alias).filter(satisfied_at__isnull=True)
    if lock:
        letters, jobs = letters.select_for_update(), jobs.select_for_update()
    own = letters.filter(key=key).order_by("id")
    if not list(own.values_list("id", flat=True)) and not dead_key:
        # Without a pending letter of the key, nothing can wait for it but a live job of
        # the key (the new job is then a duplicate), nor start to while this one runs.
        return {}
    via: dict[str, str] = {}
    frontier = [key]
    while frontier:
        waits: dict[uuid.UUID, str] = {}
        for chunk in chunks(frontier, EXISTS_BATCH):
            for job_id, parent_key in edges.filter(parent_key__in=chunk).values_list(
                "job_id", "parent_key"
            ):
                waits.setdefault(job_id, parent_key)
        frontier = []
        for chunk in chunks(sorted(waits), EXISTS_BATCH):
            for model in (jobs, letters):
                rows = model.filter(id__in=chunk).order_by("id")
                for node_id, node_key in rows.values_list("id", "key"):
                    own_key = node_key if node_key is not None else str(node_id)
                    if own_key not in via:
                        via[own_key] = waits[node_id]
                        if own_key != key:
                            frontier.append(own_key)
    return via


# Keys `cycles` looks at, at most: the status command's cost stays bounded.
CYCLE_CANDIDATES = 100


def cycles(alias: str, limit: int = 3) -> list[tuple[uuid.UUID, list[str], list[uuid.UUID]]]:
    """Blocked jobs that wait for themselves, and the keys of each one's cycle.

    Enqueues refuse them (refuse_cycle); a database written before may hold
    them. Each closes through a job of a dead key enqueued again, blocked and
    with dependents: that job's id, the keys from its own round to it ("kx",
    "ky": kx waits for ky, which waits for kx), and the key's pending letters
    (their replay, once that job is cancelled, releases the others). Locks nothing.
    """
    pending = DeadLetter.objects.using(alias).pending().filter(key=OuterRef("key"))
    closing = (
        Job.objects.using(alias)
        .filter(waiting_for__gt=0, dependents__gt=0, key__isnull=False)
        .filter(Exists(pending))
        .order_by("enqueued_at", "id")
        .values_list("id", "key")
    )
    found: list[tuple[uuid.UUID, list[str], list[uuid.UUID]]] = []
    covered: set[str] = set()
    for job_id, key in closing[:CYCLE_CANDIDATES]:
        if key is None or key in covered:  # key is not None: filtered above
            continue
        via = _waiting_for(alias, key, lock=False)
        if key not in via:
            continue
        chain = [key]
        while (step := via[chain[-1]]) != key:
            chain.append(step)
        covered.update(chain)
        letters = DeadLetter.objects.using(alias).pending().filter(key=key).order_by("dead_at")
        found.append((job_id, chain, list(letters.values_list("id", flat=True))))
        if len(found) >= limit:
            break
    return found


class _Cycle(InvalidJob):
    """A job would wait for its own waiters (refuse_cycle)."""


def refuse_cycle(
    alias: str, key: str, parents: Callable[[], Iterable[str]], *, dead_key: bool = False
) -> None:
    """Raise InvalidJob if a job of `key` after `parents()` (their keys) would wait for itself.

    A dead letter does not hold its key: jobs may wait for the key already (after=
    the letter), and a job of the key enqueued after one of them would wait for
    its own dependents, and they for it, with nothing to release either.
    """
    via = _waiting_for(alias, key, dead_key=dead_key)
    if not via:
        return
    for parent in sorted(set(parents())):
        if parent not in via:
            continue
        chain = [parent]
        while chain[-1] != key:
            chain.append(via[chain[-1]])
        waits = ", which waits for ".join(repr(k) for k in chain)
        raise _Cycle(
            f"key {key!r}: after {parent!r} would close a cycle: the job would wait for "
            f"{waits} (after a dead letter of {key!r}), and nothing could release them. "
            f"Replay that letter, or enqueue {key!r} without {parent!r} in after="
        )
