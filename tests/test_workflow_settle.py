"""Workflows, the settle side: a parent's settle releases its dependents exactly once.

Parents and children are written here as rows (a blocked job, its Dependency
edges, the parents' dependents counts), as docs/workflows.md's enqueue does.
"""

from __future__ import annotations

import json
import threading
import uuid
from functools import partial

import pytest
from django.db import connection, connections, transaction
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from django_jobs import enqueue, job
from django_jobs.attempts import lease_token
from django_jobs.models import BLOCKED_UNTIL, CompletionMarker, Dependency, Job
from django_jobs.registry import unregister
from django_jobs.rows import ClaimRequest, Finished
from django_jobs.store import JobStore
from tests.conftest import POSTGRES, wait_for
from tests.factories import MarkerFactory
from tests.testapp import jobs
from tests.testapp.models import Audit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True, params=["auto", "orm"] if POSTGRES else ["auto"])
def claim_path(request, settings):
    """Run each test on PostgreSQL's one-statement claim and on the ORM claim."""
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "CLAIM": request.param}
    return request.param


def _blocked(handler=jobs.noop, payload=None, *, queue=None) -> uuid.UUID:
    """Write a blocked job (no parents yet: _wait adds them), by hand as the store would.

    Enqueue refuses a run time this far (limits.LATEST_RUN_AT): only the store writes it.
    """
    child = enqueue(handler, payload or {}, queue=queue)
    Job.objects.filter(id=child.id).update(run_at=BLOCKED_UNTIL)
    return child.id


def _wait(child: uuid.UUID, parent: uuid.UUID) -> None:
    """Register child as waiting for the live job parent, as enqueue(after=) does, by hand."""
    with transaction.atomic():
        row = Job.objects.select_for_update().get(id=parent)
        Job.objects.filter(id=parent).update(dependents=F("dependents") + 1)
        Dependency.objects.create(
            job_id=child,
            parent_key=row.idempotency_key,
            parent_id=parent,
            created_at=timezone.now(),
        )
        Job.objects.filter(id=child).update(waiting_for=F("waiting_for") + 1)


def _after(*parents, handler=jobs.noop, payload=None, queue=None) -> uuid.UUID:
    """Enqueue a job that waits for parents (blocked while any is unfinished)."""
    return enqueue(handler, payload or {}, after=list(parents), queue=queue).id


def _claim(limit=10, queue="default"):
    token = lease_token(f"w-{uuid.uuid4().hex[:8]}", 1)
    return JobStore().claim(ClaimRequest(queues=[queue], limit=limit, token=token, lease=60))


def _finished(claimed):
    return [Finished(j.id, j.token, None, j.dependents) for j in claimed]


def _due(job_id) -> bool:
    return Job.objects.filter(id=job_id).claimable().exists()


def test_a_parents_settle_releases_its_child():
    parent = enqueue(jobs.noop, {"p": 1}).id
    child = _after(parent, queue="children")
    assert not _due(child)
    [claimed] = _claim()
    assert claimed.id == parent and claimed.dependents == 1
    assert JobStore().complete(_finished([claimed])) == {0}
    row = Job.objects.get(id=child)
    assert row.waiting_for == 0
    assert row.run_at < BLOCKED_UNTIL
    assert _due(child)
    [edge] = Dependency.objects.all()
    assert edge.satisfied_at is not None
    assert CompletionMarker.objects.filter(job_id=parent).exists()
    [released] = _claim(queue="children")
    assert released.id == child


def test_a_job_without_dependents_settles_as_before():
    parent = enqueue(jobs.noop, {"p": 1}).id
    [claimed] = _claim()
    assert claimed.dependents == 0
    assert JobStore().complete(_finished([claimed])) == {0}
    assert not Job.objects.filter(id=parent).exists()


def test_a_child_of_two_parents_settled_in_one_batch_is_released_once():
    first, second = (enqueue(jobs.noop, {"p": i}).id for i in range(2))
    child = _after(first, second, queue="children")
    claimed = _claim()
    assert {j.id for j in claimed} == {first, second}
    assert JobStore().complete(_finished(claimed)) == {0, 1}
    row = Job.objects.get(id=child)
    assert row.waiting_for == 0
    assert _due(child)
    assert Dependency.objects.filter(satisfied_at__isnull=True).count() == 0


def test_a_child_of_two_parents_waits_for_the_second():
    first, second = (enqueue(jobs.noop, {"p": i}).id for i in range(2))
    child = _after(first, second, queue="children")
    claimed = {j.id: j for j in _claim()}
    assert JobStore().complete(_finished([claimed[first]])) == {0}
    assert Job.objects.get(id=child).waiting_for == 1
    assert not _due(child)
    assert JobStore().complete(_finished([claimed[second]])) == {0}
    assert Job.objects.get(id=child).waiting_for == 0
    assert _due(child)


def test_a_settle_whose_marker_existed_releases_nothing_twice():
    parent = enqueue(jobs.noop, {"p": 1}, key="wf-parent").id
    other = enqueue(jobs.noop, {"p": 2}).id
    child = _blocked(queue="children")
    _wait(child, parent)
    _wait(child, other)
    # The parent's key was settled before (its edge with it), yet its row is live again.
    MarkerFactory(key="wf-parent")
    Dependency.objects.filter(parent_key="wf-parent").update(satisfied_at=Now())
    Job.objects.filter(id=child).update(waiting_for=1)
    claimed = {j.id: j for j in _claim()}
    assert JobStore().complete(_finished([claimed[parent]])) == {0}
    assert Job.objects.get(id=child).waiting_for == 1
    assert not _due(child)
    # Released again by hand: the edge is satisfied already, nothing is counted.
    assert JobStore().release_dependents(["wf-parent"]) == 0
    assert Job.objects.get(id=child).waiting_for == 1
    assert JobStore().complete(_finished([claimed[other]])) == {0}
    assert Job.objects.get(id=child).waiting_for == 0


def test_a_dependent_registered_between_claim_and_settle_is_released():
    parent = enqueue(jobs.noop, {"p": 1}).id
    [claimed] = _claim()
    assert claimed.dependents == 0
    # Another connection enqueues a child of it and commits after the claim.
    children: list[uuid.UUID] = []
    thread = threading.Thread(
        target=_in_thread, args=(lambda: children.append(_after(parent, queue="children")),)
    )
    thread.start()
    thread.join(30)
    [child] = children
    assert Job.objects.get(id=parent).dependents == 1
    assert Job.objects.get(id=child).waiting_for == 1
    # The parent is settled (not reported as lease lost), and its child released.
    assert JobStore().complete(_finished([claimed])) == {0}
    assert not Job.objects.filter(id=parent).exists()
    assert Job.objects.get(id=child).waiting_for == 0
    assert _due(child)


@pytest.mark.postgres
def test_a_dependent_committing_while_the_settle_waits_for_its_lock_is_released():
    # The case the fence is for: the settle's statement began before the
    # dependent's transaction committed, so that statement cannot see the edge.
    parent = enqueue(jobs.noop, {"p": 1}).id
    [claimed] = _claim()
    registered, commit = threading.Event(), threading.Event()
    children: list[uuid.UUID] = []
    settled: list[set[int]] = []

    def register():
        with transaction.atomic():
            children.append(_after(parent, queue="children"))
            registered.set()
            commit.wait(30)

    enqueuer = threading.Thread(target=_in_thread, args=(register,))
    settler = threading.Thread(
        target=_in_thread,
        args=(lambda: settled.append(JobStore().complete(_finished([claimed]))),),
    )
    enqueuer.start()
    try:
        assert registered.wait(30)
        settler.start()
        wait_for(_waiting_on_a_lock, message="the settle to wait for the parent's row")
    finally:
        commit.set()
        enqueuer.join(30)
        settler.join(30)
    assert settled == [{0}]
    [child] = children
    assert not Job.objects.filter(id=parent).exists()
    assert Job.objects.get(id=child).waiting_for == 0
    assert _due(child)


def test_a_lost_lease_is_still_lost_next_to_a_fenced_job():
    fenced, lost = (enqueue(jobs.noop, {"p": i}).id for i in range(2))
    claimed = {j.id: j for j in _claim()}
    child = _after(fenced, queue="children")
    Job.objects.filter(id=lost).update(locked_by="another#1")
    batch = [claimed[lost], claimed[fenced]]
    assert JobStore().complete(_finished(batch)) == {1}
    assert Job.objects.filter(id=lost).exists()
    assert Job.objects.get(id=child).waiting_for == 0


def _in_thread(function, *args):
    try:
        function(*args)
    finally:
        connections.close_all()


@pytest.mark.postgres
def test_two_parents_settled_in_concurrent_transactions_release_the_child_once():
    first, second = (enqueue(jobs.noop, {"p": i}).id for i in range(2))
    child = _after(first, second, queue="wf-concurrent")
    claimed = {j.id: j for j in _claim()}
    listener = _listen()
    released = threading.Event()
    results: dict[str, set[int]] = {}

    def settle_second():
        results["second"] = JobStore().complete(_finished([claimed[second]]))
        released.set()

    other = threading.Thread(target=_in_thread, args=(settle_second,))
    try:
        with transaction.atomic():
            results["first"] = JobStore().complete(_finished([claimed[first]]))
            other.start()
            # The second settle waits for this transaction's lock on the child.
            wait_for(_waiting_on_a_lock, message="the second settle to wait for a lock")
            assert not released.is_set()
        other.join(30)
        assert results == {"first": {0}, "second": {0}}
        row = Job.objects.get(id=child)
        assert row.waiting_for == 0
        assert _due(child)
        assert _notified(listener, "wf-concurrent") == 1
    finally:
        listener.close()


def _deadlock_timeout(value: str) -> None:
    """Set how long this transaction's lock waits last before PostgreSQL looks for a deadlock."""
    with connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL deadlock_timeout = '{value}'")


def _waiting_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        # Inside a transaction the activity view is read once: read it afresh.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
        return bool(cursor.fetchone()[0])


def _listen():
    import psycopg

    from django_jobs import conf

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    listener = psycopg.connect(**params, autocommit=True)
    listener.execute(f"LISTEN {conf.get('CHANNEL')}")
    return listener


def _notified(listener, queue: str) -> int:
    return sum(1 for n in listener.notifies(timeout=1.0) if n.payload == queue)


def test_a_child_released_with_a_delay_of_its_own_wakes_nobody():
    # It is due later: a woken worker would find nothing, and a --burst worker
    # would claim again for nothing.
    parent = enqueue(jobs.noop, {}).id
    child = enqueue(jobs.noop, {}, after=[parent], queue="wf-later", delay=3600).id
    [claimed] = _claim()
    listener = _listen() if POSTGRES else None
    try:
        settled = JobStore().complete(_finished([claimed]))
        assert settled == {0} and not settled.woke
        if listener is not None:
            assert _notified(listener, "wf-later") == 0
    finally:
        if listener is not None:
            listener.close()
    row = Job.objects.get(id=child)
    assert row.waiting_for == 0 and not _due(child)


def test_an_atomic_handlers_settle_releases(run_worker):
    parent = enqueue(jobs.record_atomic, {"label": "wf-parent"}).id
    child = _after(parent, handler=jobs.record, payload={"label": "wf-child"})
    worker = run_worker()
    assert worker.stats.succeeded == 2
    assert worker.stats.lost == 0
    assert not Job.objects.exists()
    parent_done = CompletionMarker.objects.get(job_id=parent).completed_at
    assert CompletionMarker.objects.get(job_id=child).started_at >= parent_done
    assert list(Audit.objects.order_by("id").values_list("label", flat=True)) == [
        "wf-parent",
        "wf-child",
    ]


def test_an_atomic_settle_releases_in_the_handlers_transaction():
    parent = enqueue(jobs.record_atomic, {"label": "wf-parent"}).id
    child = _after(parent)
    [claimed] = _claim()
    with pytest.raises(RuntimeError), transaction.atomic():
        assert JobStore().complete_atomically(claimed, None) is True
        assert Job.objects.get(id=child).waiting_for == 0
        raise RuntimeError("the handler's transaction rolls back")
    assert Job.objects.get(id=child).waiting_for == 1
    assert Dependency.objects.get().satisfied_at is None
    with transaction.atomic():
        assert JobStore().complete_atomically(claimed, None) is True
    assert Job.objects.get(id=child).waiting_for == 0
    assert _due(child)


def test_a_worker_settles_a_parent_whose_child_registered_while_it_ran(run_worker):
    @job(name="tests.wf_registers_a_child")
    def registers(payload, ctx):
        # Another connection enqueues a child of this job and commits while it runs.
        child = partial(_after, ctx.id, handler=jobs.record, payload={"label": "wf-child"})
        thread = threading.Thread(target=_in_thread, args=(child,))
        thread.start()
        thread.join(30)

    try:
        parent = enqueue(registers, {}).id
        worker = run_worker()
    finally:
        unregister("tests.wf_registers_a_child")
    assert worker.stats.lost == 0
    assert worker.stats.succeeded == 2
    assert CompletionMarker.objects.filter(job_id=parent).exists()
    assert Audit.objects.filter(label="wf-child").count() == 1
    assert not Job.objects.exists()


@pytest.mark.slow
@pytest.mark.mariadb
def test_a_worker_process_drains_a_parent_then_its_child(worker_process, claim_path):
    parent = enqueue(jobs.record, {"label": "wf-parent"}).id
    child = _after(parent, handler=jobs.record, payload={"label": "wf-child"})
    proc = worker_process(
        "--burst", extra_env={"JOBS_TEST_SETTINGS": json.dumps({"CLAIM": claim_path})}
    )
    assert proc.wait(timeout=120) == 0, proc.output()[-2000:]
    assert not Job.objects.exists()
    first = CompletionMarker.objects.get(job_id=parent)
    second = CompletionMarker.objects.get(job_id=child)
    assert second.started_at >= first.completed_at
    assert Audit.objects.filter(label__startswith="wf-").count() == 2


@pytest.mark.postgres
def test_a_released_child_wakes_its_queues_workers():
    parent = enqueue(jobs.noop, {}).id
    child = _after(parent, queue="wf-wake")
    [claimed] = _claim()
    listener = _listen()
    try:
        assert JobStore().complete(_finished([claimed])) == {0}
        assert _notified(listener, "wf-wake") == 1
        assert _due(child)
    finally:
        listener.close()


@pytest.mark.postgres
def test_a_settle_batch_locks_its_rows_in_id_order_as_after_does():
    # An enqueue after=[A, B] locks A then B (sorted); a settle of [B, A] must too, or
    # the two could each hold one and wait for the other. Hold B from another
    # connection: a settle in id order has locked A by the time it waits for B.
    first, second = sorted(enqueue(jobs.noop, {"p": i}).id for i in range(2))
    claimed = {j.id: j for j in _claim()}
    holding, release = threading.Event(), threading.Event()

    def hold_second():
        with transaction.atomic():
            list(Job.objects.select_for_update().filter(id=second))
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=_in_thread, args=(hold_second,))
    holder.start()
    assert holding.wait(30)
    results = {}
    settle = threading.Thread(
        target=_in_thread,
        args=(
            lambda: results.update(
                settled=JobStore().complete(_finished([claimed[second], claimed[first]]))
            ),
        ),
    )
    settle.start()
    try:
        wait_for(_waiting_on_a_lock, message="the settle to wait for B's lock")
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '100ms'")
            with pytest.raises(Exception, match="lock"):
                cursor.execute(
                    "SELECT id FROM django_jobs_job WHERE id = %s FOR UPDATE NOWAIT", [first]
                )
    finally:
        release.set()
        holder.join(30)
        settle.join(30)
    assert results["settled"] == {0, 1}
    assert not Job.objects.filter(id__in=[first, second]).exists()


@pytest.mark.postgres
def test_an_enqueue_after_that_loses_a_deadlock_is_tried_again_in_the_callers_transaction():
    # A rival that locks rows out of id order (code of the application's own): it
    # holds B, the enqueue locks A and waits for B, then the rival asks for A. The
    # enqueue waited first, so the database picks it; its savepoint's rollback
    # drops its lock on A, the rival commits, and the second try takes A and B.
    first, second = sorted(enqueue(jobs.noop, {"p": i}).id for i in range(2))
    rival_holds, outcome = threading.Event(), {}

    # PostgreSQL looks for a deadlock once per lock wait, deadlock_timeout after it
    # began: the enqueue's look must come after the rival closed the cycle (on a busy
    # machine that can take longer than the default 1 s, and then the rival, looking
    # later, was the victim), and the rival's never.
    def rival():
        try:
            with transaction.atomic():
                _deadlock_timeout("60s")
                list(Job.objects.select_for_update().filter(id=second))
                rival_holds.set()
                wait_for(_waiting_on_a_lock, message="the enqueue to wait for B")
                list(Job.objects.select_for_update().filter(id=first))
            outcome["rival"] = "committed"
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion below
            outcome["rival"] = type(exc).__name__

    thread = threading.Thread(target=_in_thread, args=(rival,))
    thread.start()
    try:
        assert rival_holds.wait(30)
        with transaction.atomic():
            _deadlock_timeout("5s")
            child = enqueue(jobs.noop, {"child": 1}, after=[second, first])
    finally:
        thread.join(60)
    assert outcome["rival"] == "committed"  # the enqueue was the deadlock's victim
    assert Dependency.objects.filter(job_id=child.id).count() == 2
    assert set(Job.objects.filter(id__in=[first, second]).values_list("dependents", flat=True)) == {
        1
    }
    assert Job.objects.get(id=child.id).waiting_for == 2
