"""Workflows: a blocked job's own delay or run_at counts from its release (docs/workflows.md).

The release time is read from the database: the edge's satisfied_at, written by
the same statement (PostgreSQL) or transaction (the ORM) that releases the job.
Real databases: PostgreSQL by default, TEST_DB=sqlite and TEST_DB=mariadb too.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from django_jobs import control, enqueue, workflow
from django_jobs.attempts import lease_token
from django_jobs.models import (
    BLOCKED_UNTIL,
    CompletionMarker,
    DeadLetter,
    DeadReason,
    Dependency,
    Job,
    JobState,
)
from django_jobs.rows import ClaimRequest, Finished
from django_jobs.store import JobStore
from django_jobs.testing import drain
from tests.conftest import POSTGRES
from tests.factories import DeadLetterFactory
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)

HOUR = timedelta(hours=1)
# The release's statements on the ORM path (edges, then run_at) each read the clock:
# a few milliseconds apart, far less than this. Not a speed bound.
CLOCK = timedelta(seconds=5)


@pytest.fixture(autouse=True, params=["auto", "orm"] if POSTGRES else ["auto"])
def claim_path(request, settings):
    """Run each test on PostgreSQL's one-statement claim and on the ORM claim."""
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "CLAIM": request.param}
    return request.param


def _settle(*ids, queue="default"):
    """Settle the jobs ids as a worker's batch does (sql.COMPLETE_RELEASING on PostgreSQL)."""
    token = lease_token(f"w-{uuid.uuid4().hex[:8]}", 1)
    claimed = JobStore().claim(ClaimRequest(queues=[queue], limit=100, token=token, lease=60))
    batch = [Finished(j.id, j.token, None, j.dependents) for j in claimed if j.id in ids]
    JobStore().release([j for j in claimed if j.id not in ids])  # the others stay due
    assert len(batch) == len(ids)
    assert len(JobStore().complete(batch)) == len(ids)


def _released_at(child) -> timezone.datetime:
    """When the child's last edge was satisfied: its release, on the database clock."""
    return max(Dependency.objects.filter(job_id=child).values_list("satisfied_at", flat=True))


def _row(child):
    return Job.objects.with_state().get(id=child)


def _near(when, expected):
    assert abs(when - expected) < CLOCK, (when, expected)


def test_a_delay_after_parents_counts_from_the_release():
    parent = enqueue(jobs.noop, {"p": 1}).id
    child = enqueue(jobs.noop, {}, after=[parent], delay=HOUR).id
    row = _row(child)
    assert (row.state, row.run_at, row.release_delay, row.not_before) == (
        JobState.BLOCKED,
        BLOCKED_UNTIL,
        HOUR,
        None,
    )

    _settle(parent)
    row = _row(child)
    assert (row.waiting_for, row.state) == (0, JobState.SCHEDULED)
    if POSTGRES:  # released in the settle's statement: one clock reading
        assert row.run_at == _released_at(child) + HOUR
    _near(row.run_at, _released_at(child) + HOUR)
    assert not Job.objects.filter(id=child).claimable().exists()


def test_a_float_delay_after_parents_keeps_its_fraction():
    parent = enqueue(jobs.noop, {"p": 1}).id
    child = enqueue(jobs.noop, {}, after=[parent], delay=90.25).id
    assert _row(child).release_delay == timedelta(seconds=90.25)
    _settle(parent)
    _near(_row(child).run_at, _released_at(child) + timedelta(seconds=90.25))


def test_a_run_at_after_parents_is_kept_when_it_is_later_than_the_release():
    at = timezone.now() + HOUR
    parent = enqueue(jobs.noop, {"p": 1}).id
    child = enqueue(jobs.noop, {}, after=[parent], run_at=at).id
    row = _row(child)
    assert (row.state, row.not_before, row.release_delay) == (JobState.BLOCKED, at, None)

    _settle(parent)
    row = _row(child)
    assert (row.waiting_for, row.state, row.run_at) == (0, JobState.SCHEDULED, at)


def test_a_run_at_after_parents_already_past_at_the_release_runs_at_once():
    parent = enqueue(jobs.noop, {"p": 1}).id
    child = enqueue(jobs.noop, {}, after=[parent], run_at=timezone.now() - HOUR).id
    _settle(parent)
    row = _row(child)
    assert row.state == JobState.WAITING
    _near(row.run_at, _released_at(child))
    assert Job.objects.filter(id=child).claimable().exists()


def test_a_job_without_timing_is_released_due_at_once_as_before():
    parent = enqueue(jobs.noop, {"p": 1}).id
    child = enqueue(jobs.noop, {}, after=[parent]).id
    assert (_row(child).release_delay, _row(child).not_before) == (None, None)
    _settle(parent)
    row = _row(child)
    assert row.state == JobState.WAITING
    if POSTGRES:
        assert row.run_at == _released_at(child)
    _near(row.run_at, _released_at(child))


def test_the_last_parent_releases_and_the_delay_counts_from_it():
    first, second = (enqueue(jobs.noop, {"p": i}).id for i in range(2))
    child = enqueue(jobs.noop, {}, after=[first, second], delay=HOUR).id
    _settle(first)
    assert (_row(child).state, _row(child).run_at) == (JobState.BLOCKED, BLOCKED_UNTIL)
    _settle(second)
    _near(_row(child).run_at, _released_at(child) + HOUR)


def test_parents_already_finished_leave_delay_and_run_at_as_for_a_plain_enqueue():
    parent = enqueue(jobs.noop, {"p": 1}).id
    _settle(parent)
    delayed = enqueue(jobs.noop, {"d": 1}, after=[parent], delay=HOUR)
    at = timezone.now() + HOUR
    timed = enqueue(jobs.noop, {"t": 1}, after=[parent], run_at=at).id

    row = _row(delayed.id)
    assert (row.state, row.waiting_for, row.release_delay) == (JobState.SCHEDULED, 0, None)
    if POSTGRES:  # the INSERT's statement_timestamp() for both
        assert row.run_at == delayed.enqueued_at + HOUR
    _near(row.run_at, row.enqueued_at + HOUR)
    row = _row(timed)
    assert (row.state, row.run_at, row.not_before) == (JobState.SCHEDULED, at, None)


def test_an_atomic_handlers_settle_applies_the_delay():
    # COMPLETE_ATOMIC, then RELEASE (PostgreSQL) or release_dependents (the ORM).
    parent = enqueue(jobs.record_atomic, {"label": "wf-parent"}).id
    child = enqueue(jobs.noop, {}, after=[parent], delay=HOUR).id
    at = timezone.now() + HOUR
    timed = enqueue(jobs.noop, {"t": 1}, after=[parent], run_at=at).id
    token = lease_token("w-atomic", 1)
    [claimed] = JobStore().claim(ClaimRequest(queues=["default"], limit=1, token=token, lease=60))
    assert claimed.id == parent
    with transaction.atomic():
        assert JobStore().complete_atomically(claimed, None) is True
    row = _row(child)
    assert (row.waiting_for, row.state) == (0, JobState.SCHEDULED)
    if POSTGRES:  # RELEASE is one statement: the edge and run_at read one clock
        assert row.run_at == _released_at(child) + HOUR
    _near(row.run_at, _released_at(child) + HOUR)
    assert _row(timed).run_at == at


def test_a_workflows_steps_keep_their_timing_for_their_release():
    at = timezone.now() + HOUR
    with workflow(name="timed") as w:
        root = w.enqueue(jobs.noop, {"n": 0})
        delayed = w.enqueue(jobs.noop, {"n": 1}, after=[root], delay=HOUR)
        timed = w.enqueue(jobs.noop, {"n": 2}, after=[root], run_at=at)
        past = w.enqueue(jobs.noop, {"n": 3}, after=[root], run_at=timezone.now() - HOUR)
        keyed = w.enqueue(jobs.noop, {"n": 4}, after=[root], delay=HOUR, key="timed-keyed")
        plain = w.enqueue(jobs.noop, {"n": 5}, after=[root])
        alone = w.enqueue(jobs.noop, {"n": 6}, delay=HOUR)  # no parents: as enqueue
        last = w.enqueue(jobs.noop, {"n": 7}, after=[delayed, keyed], delay=2 * HOUR)
    rows = {r.id: r for r in Job.objects.with_state()}
    assert {rows[s.id].state for s in (delayed, timed, past, keyed, plain, last)} == {
        JobState.BLOCKED
    }
    assert (rows[delayed.id].release_delay, rows[delayed.id].not_before) == (HOUR, None)
    assert (rows[keyed.id].release_delay, rows[timed.id].not_before) == (HOUR, at)
    assert (rows[plain.id].release_delay, rows[plain.id].not_before) == (None, None)
    assert rows[last.id].release_delay == 2 * HOUR
    assert (rows[alone.id].state, rows[alone.id].release_delay) == (JobState.SCHEDULED, None)
    _near(rows[alone.id].run_at, rows[alone.id].enqueued_at + HOUR)

    _settle(root.id)
    rows = {r.id: r for r in Job.objects.with_state()}
    released = _released_at(delayed.id)
    _near(rows[delayed.id].run_at, released + HOUR)
    _near(rows[keyed.id].run_at, released + HOUR)
    assert rows[timed.id].run_at == at
    _near(rows[past.id].run_at, released)
    _near(rows[plain.id].run_at, released)
    assert rows[past.id].state == rows[plain.id].state == JobState.WAITING
    assert rows[last.id].state == JobState.BLOCKED  # its parents have not run
    # The delayed parents run (made due by hand, as "run now" does): the last step's
    # two hours count from the second one's settle.
    assert JobStore().run_now(Job.objects.filter(id__in=[delayed.id, keyed.id])) == 2
    _settle(delayed.id, keyed.id)
    _near(Job.objects.get(id=last.id).run_at, _released_at(last.id) + 2 * HOUR)


def test_a_replayed_step_applies_the_replays_delay_from_its_release():
    DeadLetterFactory(name="tests.noop", payload="{}", key="dead-parent")
    step = enqueue(jobs.noop, {}, after=["dead-parent"], on_parent_dead="dead", delay=HOUR)
    assert DeadLetter.objects.get(id=step.id).reason == DeadReason.PARENT_DEAD

    # Replayed before its parent: blocked again, the replay's delay kept for its release.
    report = control.replay(DeadLetter.objects.filter(id=step.id), delay=HOUR)
    new = report.replayed[step.id]
    row = _row(new)
    assert (row.state, row.run_at, row.release_delay) == (JobState.BLOCKED, BLOCKED_UNTIL, HOUR)

    parent = control.replay(DeadLetter.objects.filter(key="dead-parent"))
    [parent_job] = parent.replayed.values()
    _settle(parent_job)
    assert CompletionMarker.objects.filter(key="dead-parent").exists()
    row = _row(new)
    assert (row.waiting_for, row.state) == (0, JobState.SCHEDULED)
    _near(row.run_at, _released_at(new) + HOUR)


def test_a_replayed_step_with_run_at_keeps_it_for_its_release():
    DeadLetterFactory(name="tests.noop", payload="{}", key="dead-parent-2")
    step = enqueue(jobs.noop, {}, after=["dead-parent-2"], on_parent_dead="dead")
    at = timezone.now() + HOUR
    new = control.replay(DeadLetter.objects.filter(id=step.id), run_at=at).replayed[step.id]
    assert (_row(new).not_before, _row(new).run_at) == (at, BLOCKED_UNTIL)
    [parent_job] = control.replay(DeadLetter.objects.filter(key="dead-parent-2")).replayed.values()
    _settle(parent_job)
    assert (_row(new).state, _row(new).run_at) == (JobState.SCHEDULED, at)


def test_drain_runs_a_delayed_step_after_its_parent_only_with_run_scheduled():
    parent = enqueue(jobs.record, {"label": "parent"}).id
    child = enqueue(jobs.record, {"label": "child"}, after=[parent], delay=HOUR).id
    assert len(drain().attempts) == 1  # the parent; its child is then scheduled an hour ahead
    assert _row(child).state == JobState.SCHEDULED
    assert len(drain(run_scheduled=True).attempts) == 1
    assert CompletionMarker.objects.filter(job_id=child).exists()
