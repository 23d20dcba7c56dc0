"""Workflows under real concurrency: enqueues with `after`, settles and replays that lock
the same rows must wait for each other, never deadlock.

Each scenario is lined up by a third connection, the holder, that locks the first
row both sides need (SELECT ... FOR UPDATE in an open transaction). The side that
must get that row first is started and seen waiting for a lock (pg_stat_activity,
or InnoDB's innodb_trx), then the other, which takes its other rows before it
waits too; then the holder commits. Locking in two orders, the sides deadlock there
every time; locking in one, the second waits for the first to commit.
"""

from __future__ import annotations

import contextlib
import random
import threading
import uuid
from datetime import timedelta
from functools import partial

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from django_jobs import control, enqueue
from django_jobs.attempts import lease_token
from django_jobs.models import BLOCKED_UNTIL, CompletionMarker, DeadLetter, Dependency, Job
from django_jobs.rows import ClaimRequest, Finished
from django_jobs.store import JobStore
from tests.conftest import ENGINE, POSTGRES, wait_for
from tests.factories import DeadLetterFactory, JobFactory

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(ENGINE == "sqlite", reason="not on SQLite: one writer at a time, no race"),
]


# Ids far above the uuid7 ids enqueue makes now (0x019...): a job enqueued in the
# test sorts before these, as the scenarios need.
LOW = uuid.UUID("10000000-0000-7000-8000-000000000001")
MIDDLE = uuid.UUID("e0000000-0000-7000-8000-000000000001")
HIGH = uuid.UUID("f0000000-0000-7000-8000-000000000001")
TOP = uuid.UUID("f8000000-0000-7000-8000-000000000001")


class Side(threading.Thread):
    """Run fn on this thread's own connection; keep its backend id, result and error."""

    def __init__(self, fn, *args, **kwargs):
        super().__init__(daemon=True)
        self.call = partial(fn, *args, **kwargs)
        self.backend = None
        self.connected = threading.Event()
        self.result = None
        self.error: BaseException | None = None

    def run(self):
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()" if POSTGRES else "SELECT CONNECTION_ID()")
                self.backend = cursor.fetchone()[0]
            self.connected.set()
            self.result = self.call()
        except BaseException as error:  # reported by the test, whatever it is
            self.error = error
        finally:
            self.connected.set()
            connections.close_all()

    def finish(self):
        """Join the thread; fail on its error, return its result."""
        return finish(self)[0]


def finish(*sides: Side) -> list:
    """Join every side; fail naming each one's error, else return their results."""
    for side in sides:
        side.join(60)
    assert not any(side.is_alive() for side in sides), "a side still runs after 60 s"
    errors = [
        f"{side.call.func.__name__}: {type(side.error).__name__}: {side.error}"
        for side in sides
        if side.error is not None
    ]
    assert errors == [], "\n".join(errors)
    return [side.result for side in sides]


def _waits_for_a_lock(backend) -> bool:
    with connection.cursor() as cursor:
        if POSTGRES:
            cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [backend])
            row = cursor.fetchone()
            return bool(row) and row[0] == "Lock"
        cursor.execute(
            "SELECT trx_state FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = %s",
            [backend],
        )
        row = cursor.fetchone()
        return bool(row) and row[0] == "LOCK WAIT"


def start_until_waiting(side: Side) -> Side:
    """Start side and return once it waits for a row lock (or has finished already)."""
    side.start()
    assert side.connected.wait(30)
    wait_for(
        lambda: not side.is_alive() or _waits_for_a_lock(side.backend),
        # InnoDB refreshes innodb_trx only when it was not read for 0.1 s.
        interval=0.05 if POSTGRES else 0.25,
        message="the side to wait for a lock",
    )
    return side


@contextlib.contextmanager
def held(model, pk):
    """Hold row pk of model locked from another connection until the block ends."""
    holding, release = threading.Event(), threading.Event()

    def hold():
        with transaction.atomic():
            list(model.objects.select_for_update().filter(pk=pk).values_list("pk", flat=True))
            holding.set()
            release.wait(60)

    holder = Side(hold)
    holder.start()
    try:
        wait_for(lambda: holding.is_set() or not holder.is_alive(), message="the holder")
        assert holding.is_set(), f"the holder failed: {holder.error!r}"
        yield
    finally:
        release.set()
        holder.finish()


def claim(queue: str, limit: int = 100):
    token = lease_token(f"w-{uuid.uuid4().hex[:8]}", 1)
    return JobStore().claim(ClaimRequest(queues=[queue], limit=limit, token=token, lease=60))


def finished(claimed):
    return [Finished(job.id, job.token, None, job.dependents) for job in claimed]


def settle(queue: str) -> int:
    """Claim and settle every due job of queue; return how many."""
    claimed = claim(queue)
    assert JobStore().complete(finished(claimed)) == set(range(len(claimed)))
    return len(claimed)


def released(job_id) -> bool:
    """Whether job_id was released exactly once per parent: due, and every edge satisfied."""
    row = Job.objects.get(id=job_id)
    assert row.waiting_for == 0, f"{job_id} waits for {row.waiting_for}"
    assert row.run_at < BLOCKED_UNTIL
    assert not Dependency.objects.filter(job_id=job_id, satisfied_at__isnull=True).exists()
    return True


def atomic_enqueue(*args, **kwargs):
    """enqueue() inside the caller's transaction, as an application calls it.

    On MariaDB a deadlock rolls the whole transaction back, so an enqueue there is
    not tried again: the caller gets the error.
    """
    with transaction.atomic():
        return enqueue(*args, **kwargs)


def test_two_enqueues_naming_the_same_parents_by_id_and_by_key_do_not_deadlock():
    # One names P1 by id, the other by key. Sorting id-named parents before
    # key-named ones would lock P1 then P2 in the first and P2 then P1 in the second.
    first = JobFactory(id=LOW, key="p1", queue="parents").id
    second = JobFactory(id=HIGH, queue="parents").id
    with held(Job, first):
        by_id = start_until_waiting(Side(atomic_enqueue, "tests.noop", after=[first, second]))
        by_key = start_until_waiting(Side(atomic_enqueue, "tests.noop", after=["p1", second]))
    children = [result.id for result in finish(by_id, by_key)]
    assert Job.objects.get(id=first).dependents == 2
    assert Job.objects.get(id=second).dependents == 2
    assert settle("parents") == 2
    assert all(released(child) for child in children)
    assert Dependency.objects.filter(satisfied_at__isnull=False).count() == 4


def _settle_side(claimed, how: str):
    if how == "batch":
        return JobStore().complete(finished(claimed))
    with transaction.atomic():  # an atomic handler's settle, in its own transaction
        return [JobStore().complete_atomically(job, None) for job in claimed]


@pytest.mark.parametrize("how", ["batch", "atomic"])
def test_an_enqueue_naming_a_parent_and_its_blocked_child_while_the_parent_settles(how):
    # The settle locks P (its delete), then C (the release); the enqueue names both,
    # and C sorts before P by id.
    parent = JobFactory(id=HIGH, queue="parents").id
    child = enqueue("tests.noop", after=[parent], queue="children").id
    assert str(child) < str(parent)
    [claimed] = claim("parents")
    assert claimed.dependents == 1
    with held(Job, parent):
        settling = start_until_waiting(Side(_settle_side, [claimed], how))
        enqueuing = start_until_waiting(
            Side(atomic_enqueue, "tests.noop", after=[parent, child], queue="grandchildren")
        )
    settled, grandchild = finish(settling, enqueuing)
    assert settled in ({0}, [True])
    assert CompletionMarker.objects.filter(job_id=parent).exists()
    assert released(child)
    assert settle("children") == 1
    assert released(grandchild.id)
    assert Dependency.objects.filter(satisfied_at__isnull=True).count() == 0


def test_an_enqueue_naming_a_blocked_child_and_another_parent_of_the_settling_batch():
    # The batch {Y, P} settles: it locks Y and P, then P's child C. The enqueue
    # names [C, Y], C before Y by id.
    parent = JobFactory(id=HIGH, queue="parents").id
    other = JobFactory(id=MIDDLE, queue="parents").id
    child = enqueue("tests.noop", after=[parent], queue="children").id
    assert str(child) < str(other) < str(parent)
    claimed = claim("parents")
    assert sorted(job.dependents for job in claimed) == [0, 1]
    with held(Job, other):
        settling = start_until_waiting(Side(JobStore().complete, finished(claimed)))
        enqueuing = start_until_waiting(
            Side(atomic_enqueue, "tests.noop", after=[child, other], queue="grandchildren")
        )
    settled, grandchild = finish(settling, enqueuing)
    assert settled == {0, 1}
    assert released(child)
    assert settle("children") == 1
    assert released(grandchild.id)
    assert Dependency.objects.filter(satisfied_at__isnull=True).count() == 0


def test_a_replay_of_letters_while_an_enqueue_waits_for_them_does_not_deadlock():
    # The replay takes its letters newest first (DeadLetter's ordering): L2, then
    # L1. The enqueue locks the pending letters it names by id: L1, then L2.
    now = timezone.now()
    older = DeadLetterFactory(id=LOW, queue="replayed", dead_at=now - timedelta(minutes=2)).id
    newer = DeadLetterFactory(id=MIDDLE, queue="replayed", dead_at=now - timedelta(minutes=1)).id
    with held(DeadLetter, older):
        enqueuing = start_until_waiting(
            Side(atomic_enqueue, "tests.noop", after=[older, newer], queue="children")
        )
        replaying = start_until_waiting(
            Side(control.replay, DeadLetter.objects.filter(id__in=[older, newer]))
        )
    child, report = finish(enqueuing, replaying)
    assert set(report.replayed) == {older, newer}
    assert Job.objects.get(id=child.id).waiting_for == 2
    assert settle("replayed") == 2
    assert released(child.id)
    assert Dependency.objects.filter(satisfied_at__isnull=True).count() == 0


def test_an_enqueue_naming_a_parent_by_key_while_its_settle_holds_the_row():
    # InnoDB: an UPDATE by key locks the key's index entry, then the row. A settle
    # that locked the row (with the jobs of its batch and those it releases, in id
    # order: P, its child C, then Y) deletes it next, and needs that entry too.
    parent = enqueue("tests.noop", key="p", queue="parents").id
    child = enqueue("tests.noop", after=[parent], queue="children").id
    other = JobFactory(id=HIGH, queue="parents").id
    assert str(parent) < str(child) < str(other)
    claimed = claim("parents")
    with held(Job, child):
        settling = start_until_waiting(Side(JobStore().complete, finished(claimed)))
        enqueuing = start_until_waiting(
            Side(atomic_enqueue, "tests.noop", after=["p"], queue="grandchildren")
        )
    settled, grandchild = finish(settling, enqueuing)
    assert settled == {0, 1}
    assert released(child)
    # Enqueued before the settle, or after it (its parent done then): released either way.
    row = Job.objects.get(id=grandchild.id)
    assert row.waiting_for == 0 and row.run_at < BLOCKED_UNTIL
    assert Dependency.objects.filter(satisfied_at__isnull=True).count() == 0


def test_a_settle_does_not_wait_for_a_row_outside_its_batch():
    # InnoDB plans a DELETE of most of a small table's ids as a full scan, which
    # waits for every row it passes: a settle holding its batch would wait for the
    # unrelated row held here, then deadlock with its holder naming the batch next.
    unrelated = JobFactory(id=LOW, queue="elsewhere").id
    batch = [
        JobFactory(id=uuid.UUID(f"e000000{i}-0000-7000-8000-000000000001"), queue="parents").id
        for i in range(8)
    ]
    claimed = claim("parents")
    assert sorted(job.id for job in claimed) == batch
    with held(Job, unrelated):
        settling = Side(JobStore().complete, finished(claimed))
        settling.start()
        settling.join(20)
        assert not settling.is_alive(), "the settle waits for a row it does not settle"
        assert settling.finish() == set(range(len(batch)))
    assert set(CompletionMarker.objects.values_list("job_id", flat=True)) == set(batch)
    assert list(Job.objects.values_list("id", flat=True)) == [unrelated]


def test_two_enqueues_naming_a_letter_by_key_do_not_scan_the_letters_they_do_not_name():
    # A letter's key is in no index: InnoDB's locking read by key scanned every
    # letter in id order, waiting for those others held. Each enqueue locks its
    # letter by id (L, then H) and then the letter of key "top" (T, last by id):
    # the first scanned on to M (the holder's), the second to L (the first's),
    # and once M was free the first reached H (the second's).
    letters = [
        DeadLetterFactory(id=LOW, queue="dead"),
        DeadLetterFactory(id=MIDDLE, queue="dead"),
        DeadLetterFactory(id=HIGH, queue="dead"),
        DeadLetterFactory(id=TOP, key="top", queue="dead"),
    ]
    low, middle, high, top = (letter.id for letter in letters)
    with held(DeadLetter, middle):
        first = start_until_waiting(Side(atomic_enqueue, "tests.noop", after=[low, "top"]))
        second = start_until_waiting(Side(atomic_enqueue, "tests.noop", after=[high, "top"]))
    children = [result.id for result in finish(first, second)]
    assert [Job.objects.get(id=child).waiting_for for child in children] == [2, 2]
    assert sorted(Dependency.objects.values_list("parent_id", flat=True)) == sorted(
        [low, top, high, top]
    )


def test_a_replay_that_loses_a_deadlock_to_an_enqueue_is_tried_again():
    # A replay locks its letter L, then L's parent P (lower by id); an enqueue
    # naming P, two more jobs and L locks them in id order. InnoDB rolls back the
    # lighter side, the replay: its batch, its own transaction, runs again.
    parents = [
        JobFactory(id=uuid.UUID(f"{i}0000000-0000-7000-8000-000000000001"), queue="parents").id
        for i in (1, 2, 3)
    ]
    letter = DeadLetterFactory(id=HIGH, name="tests.noop", payload="{}", queue="replayed").id
    Dependency.objects.create(
        job_id=letter, parent_key=str(parents[0]), parent_id=parents[0], created_at=timezone.now()
    )
    with held(Job, parents[0]):
        enqueuing = start_until_waiting(Side(enqueue, "tests.noop", after=[*parents, letter]))
        replaying = start_until_waiting(Side(control.replay, DeadLetter.objects.filter(id=letter)))
    child, report = finish(enqueuing, replaying)
    assert list(report.replayed) == [letter]
    assert Job.objects.get(id=child.id).waiting_for == 4
    replay = Job.objects.get(id=report.replayed[letter])
    assert (replay.waiting_for, replay.dependents) == (1, 1)


# The property test's size: rounds of ENQUEUERS threads against one settle and one replay.
ROUNDS = 12
ENQUEUERS = 4
ROOTS, CHILDREN, LETTERS = 3, 2, 2


def _random_id(rng: random.Random) -> uuid.UUID:
    """An id anywhere in the id space, laid out as uuid7() makes them (version 7).

    MariaDB's uuid column sorts a version 1-5 UUID by its groups reversed, unlike
    Python: only ids of uuid7's layout sort the same in both, as every id the
    package makes does.
    """
    bits = rng.getrandbits(128) & ~(0xF << 76) & ~(0x3 << 62)
    return uuid.UUID(int=bits | 7 << 76 | 0x2 << 62)


def _named(rng: random.Random, parent):
    """A parent (a job or a letter) as `after` may name it: by id or by dedupe key, at random."""
    return parent.key if rng.random() < 0.5 else parent.id


def _settle_in_batches(rng: random.Random, barrier: threading.Barrier, claimed):
    barrier.wait(30)
    batch = list(claimed)
    rng.shuffle(batch)
    cut = rng.randint(1, len(batch))
    for part in (batch[:cut], batch[cut:]):
        if rng.random() < 0.5:
            assert JobStore().complete(finished(part)) == set(range(len(part)))
        else:
            for job in part:  # as an atomic handler's settle
                with transaction.atomic():
                    assert JobStore().complete_atomically(job, None)


def _replay(barrier: threading.Barrier, letters):
    barrier.wait(30)
    report = control.replay(DeadLetter.objects.filter(id__in=letters))
    assert set(report.replayed) == set(letters)


def _enqueue_after(barrier: threading.Barrier, after, own_transaction: bool):
    barrier.wait(30)
    write = enqueue if own_transaction else atomic_enqueue
    return write("tests.noop", after=after, queue="leaves")


def test_enqueues_settles_and_replays_at_random_never_deadlock_and_release_each_edge_once():
    rng = random.Random(20261201)
    errors = []
    for round_ in range(ROUNDS):
        # Roots and letters with random ids, blocked children of the roots (made
        # now, so mostly before their parent by id), letters dead in random order:
        # named in any order, by id or by key.
        roots = [
            JobFactory(id=_random_id(rng), key=f"r{round_}-{i}", queue="parents")
            for i in range(ROOTS)
        ]
        for i in range(CHILDREN):
            enqueue(
                "tests.noop", key=f"c{round_}-{i}", after=[rng.choice(roots).id], queue="middle"
            )
        children = list(Job.objects.filter(queue="middle", key__startswith=f"c{round_}-"))
        now = timezone.now()
        letters = [
            DeadLetterFactory(
                id=_random_id(rng),
                key=f"l{round_}-{i}",
                name="tests.noop",
                payload="{}",
                queue="replayed",
                dead_at=now - timedelta(seconds=rng.randint(1, 600)),
            )
            for i in range(LETTERS)
        ]
        claimed = claim("parents")
        barrier = threading.Barrier(ENQUEUERS + 2)
        sides = [
            Side(_settle_in_batches, random.Random(rng.random()), barrier, claimed),
            Side(_replay, barrier, [letter.id for letter in letters]),
        ]
        for _ in range(ENQUEUERS):
            parents = rng.sample(roots + children + letters, rng.randint(2, 4))
            after = [_named(rng, p) for p in parents]
            sides.append(Side(_enqueue_after, barrier, after, rng.random() < 0.5))
        for side in sides:
            side.start()
        for side in sides:
            side.join(60)
            assert not side.is_alive()
            if side.error is not None:
                name = side.call.func.__name__
                errors.append(f"round {round_}, {name}: {type(side.error).__name__}: {side.error}")
    assert errors == []
    # Quiet now: every live job waits for exactly its unsatisfied edges.
    for job_id, waiting_for in Job.objects.values_list("id", "waiting_for"):
        open_edges = Dependency.objects.filter(job_id=job_id, satisfied_at__isnull=True).count()
        assert waiting_for == open_edges, job_id
    # Settle everything left; a job never released would stay blocked here.
    for _ in range(10):
        if not Job.objects.exists():
            break
        for queue in ("replayed", "middle", "leaves"):
            settle(queue)
    assert list(Job.objects.values_list("id", "waiting_for")) == []
    assert Dependency.objects.filter(satisfied_at__isnull=True).count() == 0
    assert CompletionMarker.objects.count() == ROUNDS * (ROOTS + CHILDREN + LETTERS + ENQUEUERS)
