"""Rolling deploys: workers claim only the names they know; names no live worker knows wait.

The process tests run real `runjobs` processes of two "releases": the old one is
started with JOBS_TEST_OLD_RELEASE=1, which leaves the handler tests.added_in_v2
out of tests/testapp/jobs.py (see tests/settings.py).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from datetime import timedelta
from importlib.util import find_spec
from io import StringIO

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_jobs import enqueue, registry, status
from django_jobs.models import (
    CompletionMarker,
    DeadLetter,
    DeadReason,
    Job,
    UnknownName,
    WorkerBeat,
)
from django_jobs.registry import job
from django_jobs.worker import Worker
from tests.admin_fixtures import url
from tests.conftest import wait_for
from tests.factories import JobFactory, WorkerBeatFactory
from tests.testapp import jobs
from tests.testapp.models import Audit

pytestmark = pytest.mark.django_db(transaction=True)

NEW = "tests.added_in_v2"
# Small intervals, so that a worker's upkeep looks often and a killed worker expires soon.
FAST = {"MAINTENANCE_INTERVAL": 0.2, "WORKER_EXPIRY": 2.0, "POLL_INTERVAL": 0.1}
SLACK = timedelta(seconds=0.25)  # the worker's clock against the database's (one machine)


def _fast(settings, grace):
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, **FAST, "UNKNOWN_NAME_GRACE": grace}


def _start(worker_process, *, old, grace):
    """Start a runjobs process of the old or the new release; return it and its heartbeat row."""
    env = {"JOBS_TEST_SETTINGS": json.dumps({**FAST, "UNKNOWN_NAME_GRACE": grace})}
    if old:
        env["JOBS_TEST_OLD_RELEASE"] = "1"
    proc = worker_process("--concurrency", "2", extra_env=env)
    row = wait_for(
        lambda: WorkerBeat.objects.filter(pid=proc.pid, handlers__isnull=False).first(),
        message="the worker's heartbeat row",
    )
    return proc, row


def _status_text():
    out = StringIO()
    call_command("jobs", "status", stdout=out)
    return out.getvalue()


def _stop(*procs):
    for proc in procs:
        proc.signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=30) == 0, proc.output()[-2000:]


# ---- two releases, real processes ----------------------------------------------------------


@pytest.mark.slow
def test_old_worker_leaves_a_new_name_waiting_for_the_new_worker(worker_process, settings):
    _fast(settings, grace=600)
    old, old_row = _start(worker_process, old=True, grace=600)
    # Each worker publishes the names it claims: @job handlers and django.tasks tasks.
    assert NEW not in old_row.handlers
    assert "tests.record" in old_row.handlers
    if find_spec("django.tasks") is not None:
        assert "tests.testapp.tasks.record" in old_row.handlers
    with transaction.atomic():  # all five at once, as the upkeep's next look sees them
        waiting = [enqueue(jobs.added_in_v2, {"label": f"v2-{i}"}) for i in range(5)]
    enqueue(jobs.record, {"label": "v1"})
    wait_for(lambda: Audit.objects.filter(label="v1").exists(), message="the old worker's job")

    [unknown] = wait_for(status.unknown_names, message="the old worker's upkeep to see the name")
    assert (unknown.name, unknown.jobs) == (NEW, 5)
    assert unknown.dead_letter_at == unknown.since + timedelta(seconds=600)
    text = _status_text()
    assert "no live worker knows these job names" in text
    assert NEW in text.split("no live worker knows")[1]
    time.sleep(1.0)  # ten more polls of the old worker
    rows = Job.objects.filter(name=NEW)
    assert {(j.attempts, j.locked_by, len(j.errors)) for j in rows} == {(0, None, 0)}

    new, new_row = _start(worker_process, old=False, grace=600)
    assert NEW in new_row.handlers
    wait_for(
        lambda: CompletionMarker.objects.filter(name=NEW).count() == 5,
        message="the new worker to run the new jobs",
    )
    markers = CompletionMarker.objects.filter(job_id__in=[r.id for r in waiting])
    assert set(markers.values_list("worker_id", "attempts")) == {(new_row.id, 1)}
    assert not DeadLetter.objects.exists()
    wait_for(lambda: not status.unknown_names(), message="the name to be known again")
    assert NEW not in _status_text()
    _stop(old, new)


@pytest.mark.slow
def test_a_name_no_live_worker_knows_is_dead_lettered_after_the_grace(worker_process, settings):
    grace = 3
    _fast(settings, grace)
    old, old_row = _start(worker_process, old=True, grace=grace)
    orphan = enqueue(jobs.added_in_v2, {"label": "orphan"})
    [unknown] = wait_for(status.unknown_names, message="the upkeep to see the name")
    report = StringIO()
    call_command("jobs", "status", "--json", stdout=report)
    [shown] = json.loads(report.getvalue())["unknown_names"]
    assert shown == {
        "name": NEW,
        "jobs": 1,
        "since": unknown.since.isoformat(),
        "dead_letter_at": (unknown.since + timedelta(seconds=grace)).isoformat(),
    }
    letter = wait_for(
        lambda: DeadLetter.objects.filter(id=orphan.id).first(),
        timeout=30,
        message="the job to be dead-lettered",
    )
    assert letter.dead_at >= unknown.since + timedelta(seconds=grace) - SLACK
    assert (letter.reason, letter.name, letter.attempts) == (DeadReason.UNKNOWN_NAME, NEW, 0)
    assert letter.errors[-1]["worker"] == old_row.id
    assert f"no live worker has known the name {NEW!r}" in letter.error
    assert not Job.objects.filter(id=orphan.id).exists()
    assert not Audit.objects.exists()
    wait_for(lambda: not status.unknown_names(), message="the name to be forgotten")
    _stop(old)


@pytest.mark.slow
def test_without_live_workers_nothing_is_dead_lettered_and_the_outage_does_not_count(
    worker_process, settings
):
    grace = 3
    _fast(settings, grace)
    old, _ = _start(worker_process, old=True, grace=grace)
    orphan = enqueue(jobs.added_in_v2, {"label": "orphan"})
    wait_for(status.unknown_names, message="the upkeep to see the name")
    old.signal(signal.SIGKILL)  # the whole fleet is gone, without a word
    old.wait()
    time.sleep(grace + 2.5)  # longer than the grace, and than WORKER_EXPIRY
    assert Job.objects.filter(id=orphan.id).exists()
    assert not DeadLetter.objects.exists()
    assert status.unknown_names() == []  # what no live worker confirms is not shown
    text = _status_text()
    assert "0 live worker(s)" in text and NEW not in text

    back = timezone.now()
    again, _ = _start(worker_process, old=True, grace=grace)
    letter = wait_for(
        lambda: DeadLetter.objects.filter(id=orphan.id).first(),
        timeout=30,
        message="the job to be dead-lettered a grace period after the fleet came back",
    )
    # The grace started again when a live worker looked again, not before the outage.
    assert letter.dead_at >= back + timedelta(seconds=grace) - SLACK
    _stop(again)


# ---- one worker in-process ---------------------------------------------------------------


def test_a_live_worker_that_does_not_publish_its_names_keeps_every_name_waiting(
    run_worker, settings
):
    _fast(settings, grace=0)
    WorkerBeatFactory(id="h:1:old", pid=1, concurrency=1, handlers=None)
    row = JobFactory(name="os.system")
    run_worker()
    assert Job.objects.filter(id=row.id, attempts=0).exists()
    assert not DeadLetter.objects.exists()
    assert not UnknownName.objects.exists()


def test_an_expired_lease_of_an_unknown_name_is_not_taken_over_and_is_buried(run_worker, settings):
    row = JobFactory(name="os.system", lease_expired=True, worker="w:9:aa", claim_seq=3)
    _fast(settings, grace=600)
    # A peer that stays live (and lacks the name too): the burst worker's exit leaves the row.
    WorkerBeatFactory(handlers=["tests.noop"], last_seen_at=timezone.now() + timedelta(hours=1))
    run_worker()
    assert Job.objects.get(id=row.id).locked_by == "w:9:aa#3"  # not taken over
    [unknown] = status.unknown_names()
    assert (unknown.name, unknown.jobs) == ("os.system", 1)
    _fast(settings, grace=0)
    run_worker()
    letter = DeadLetter.objects.get(id=row.id)
    assert (letter.reason, letter.attempts) == (DeadReason.UNKNOWN_NAME, 1)
    assert [e["type"] for e in letter.errors] == [
        "django_jobs.LeaseExpired",
        "django_jobs.UnknownJob",
    ]
    assert letter.errors[0]["worker"] == "w:9:aa"


def test_any_workers_upkeep_clears_names_no_longer_unknown(django_assert_num_queries):
    # Rows other workers wrote: a name whose jobs have all run, one a live worker knows now.
    _unknown_row("shop.ran", minutes_ago=1)
    _unknown_row("shop.refund", minutes_ago=1)
    JobFactory(name="shop.refund")
    WorkerBeatFactory(handlers=["shop.refund"])
    upkeep = Worker(concurrency=1)._ops  # this worker lacks both names, and never found one
    upkeep._unknown_names()
    assert not UnknownName.objects.exists()
    assert "no live worker knows" not in _status_text()
    # With nothing unknown, the pass stays cheap: the scan and one small read.
    Job.objects.all().delete()
    with django_assert_num_queries(2):
        upkeep._unknown_names()


def test_a_worker_clears_the_unknown_names_it_recorded_when_it_exits(run_worker, settings, caplog):
    _fast(settings, grace=600)
    JobFactory(name="shop.added_later")
    run_worker()
    assert any("shop.added_later" in r.getMessage() for r in caplog.records)  # it was found
    # No live worker is left to confirm or clear it: the exiting worker does.
    assert not UnknownName.objects.exists()
    assert Job.objects.filter(name="shop.added_later", attempts=0).exists()


def test_a_name_registered_while_the_worker_runs_is_claimed_and_published(settings):
    _fast(settings, grace=600)
    worker = Worker(concurrency=1)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: WorkerBeat.objects.filter(id=worker.id).exists(), message="its row")
        assert "tests.late" not in WorkerBeat.objects.get(id=worker.id).handlers

        @job(name="tests.late")
        def late(payload, ctx):
            Audit.objects.create(label="late", job_id=ctx.id)

        try:
            late.enqueue()
            wait_for(lambda: Audit.objects.filter(label="late").exists(), message="the late job")
            wait_for(
                lambda: "tests.late" in WorkerBeat.objects.get(id=worker.id).handlers,
                message="the new name in the heartbeat row",
            )
        finally:
            registry.unregister("tests.late")
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()


# ---- display and settings ----------------------------------------------------------------


def _unknown_row(name, *, minutes_ago, fresh=True):
    now = timezone.now()
    seen = now if fresh else now - timedelta(minutes=5)
    return UnknownName.objects.create(
        name=name, since=now - timedelta(minutes=minutes_ago), seen_at=seen, jobs=1
    )


def test_jobs_admin_and_dashboard_show_names_no_live_worker_knows(admin_client_, settings):
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "UNKNOWN_NAME_GRACE": "2h"}
    orphan = JobFactory(name="shop.refund")
    JobFactory(name="tests.noop")
    JobFactory(name="shop.stale")
    _unknown_row("shop.refund", minutes_ago=7)
    _unknown_row("shop.stale", minutes_ago=7, fresh=False)  # no live worker confirmed it lately

    page = admin_client_.get(url("job_changelist"), {"state": "unknown_name"})
    assert page.status_code == 200
    shown = {str(j.pk) for j in page.context["cl"].result_list}
    assert shown == {str(orphan.pk)}
    assert "no live worker knows this name since" in page.content.decode()
    detail = admin_client_.get(url("job_change", orphan.pk)).content.decode()
    assert "no live worker knows this name since" in detail

    dashboard = admin_client_.get(url("dashboard")).content.decode()
    assert 'id="django-jobs-unknown-names"' in dashboard
    assert 'data-name="shop.refund"' in dashboard and "shop.stale" not in dashboard
    [unknown] = status.unknown_names()
    assert unknown.dead_letter_at == unknown.since + timedelta(hours=2)


def test_with_no_grace_an_unknown_name_is_due_for_dead_letters_since_it_was_found(settings):
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "UNKNOWN_NAME_GRACE": 0}
    _unknown_row("shop.refund", minutes_ago=1)
    [unknown] = status.unknown_names()
    assert unknown.dead_letter_at == unknown.since  # not "never" (a zero grace is falsy)
    report = StringIO()
    call_command("jobs", "status", "--json", stdout=report)
    [shown] = json.loads(report.getvalue())["unknown_names"]
    assert shown["dead_letter_at"] == unknown.since.isoformat()


def test_without_unknown_names_the_admin_and_status_say_nothing_of_them(admin_client_):
    JobFactory(name="tests.noop")
    page = admin_client_.get(url("job_changelist")).content.decode()
    assert "no live worker knows this name" not in page
    assert "django-jobs-unknown-names" not in admin_client_.get(url("dashboard")).content.decode()
    assert "no live worker knows" not in _status_text()


@pytest.mark.django_db(databases=["default", "other", "jobs2"])
@pytest.mark.parametrize(
    ("value", "valid"),
    [
        (None, True),
        (0, True),
        ("2h", True),
        (timedelta(days=1), True),
        ("soon", False),
        (-1, False),
        (float("nan"), False),
        (True, False),
        (1e13, False),  # beyond what date arithmetic can hold
        (1e300, False),
    ],
)
def test_the_grace_setting_is_checked(value, valid):
    with override_settings(DJANGO_JOBS={"UNKNOWN_NAME_GRACE": value}):
        assert ("django_jobs.E212" not in {m.id for m in run_checks()}) is valid


def test_a_name_no_live_worker_knows_is_logged_once_with_the_fix(run_worker, settings, caplog):
    # The first-run case: a handler added to jobs.py while runjobs kept the old code.
    _fast(settings, grace=600)
    JobFactory.create_batch(2, name="shop.added_later")
    run_worker()
    told = [r.getMessage() for r in caplog.records if "shop.added_later" in r.getMessage()]
    assert len(told) == 1, told
    assert "2 waiting job(s) named 'shop.added_later'" in told[0]
    assert "restart the workers" in told[0] and "0:10:00" in told[0]
    assert Job.objects.filter(name="shop.added_later", attempts=0).count() == 2


def test_a_name_from_a_module_the_workers_never_import_says_so(run_worker, settings, caplog):
    # The handler lives in an app's module that is neither jobs.py nor tasks.py: the web
    # process imported it (the view did), the worker never does.
    _fast(settings, grace=600)
    name = "tests.testapp.never_imported.send_receipt"
    JobFactory.create_batch(1, name=name)
    run_worker()
    told = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert len(told) == 1, told
    assert (
        "its name says tests.testapp.never_imported, which the workers never import: they "
        "import the jobs.py (and tasks.py) modules of installed apps" in told[0]
    ), told
    assert "restart the workers" not in told[0]
    assert "tests.testapp.never_imported" not in sys.modules  # looked at, never imported
