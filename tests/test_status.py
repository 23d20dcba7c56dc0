"""`jobs status`: queue figures from the tables, live workers from their heartbeat rows."""

from __future__ import annotations

import json
import os
import signal
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from django_jobs import control, enqueue, status
from django_jobs.models import CompletionMarker, DeadLetter, Job, JobState, WorkerBeat
from tests.conftest import wait_for
from tests.factories import JobFactory, WorkerBeatFactory
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def _from_tables():
    """The same figures, counted straight from the tables."""
    now = timezone.now()
    hour = now - timedelta(hours=1)
    result = {}
    for queue in ("default", "emails"):
        live = Job.objects.filter(queue=queue)
        result[queue] = {
            "waiting": live.filter(locked_by__isnull=True, run_at__lte=now).count(),
            "scheduled": live.filter(locked_by__isnull=True, run_at__gt=now).count(),
            "running": live.filter(locked_by__isnull=False).count(),
            "done_last_hour": CompletionMarker.objects.filter(
                queue=queue, completed_at__gte=hour
            ).count(),
            "dead_last_hour": DeadLetter.objects.filter(queue=queue, dead_at__gte=hour).count(),
        }
    return result


def test_status_figures_equal_what_the_tables_hold(status_rows):
    report = status.status()
    by_name = {q.name: q for q in report.queues}
    expected = _from_tables()
    assert expected["default"] == {
        "waiting": 3,
        "scheduled": 2,
        "running": 1,
        "done_last_hour": 3,
        "dead_last_hour": 1,
    }
    for name, figures in expected.items():
        got = by_name[name]
        assert {k: getattr(got, k) for k in figures} == figures
    assert by_name["emails"].paused and not by_name["default"].paused
    assert 115 <= by_name["default"].oldest_wait <= 130
    assert 5 <= by_name["emails"].oldest_wait <= 20
    assert [w.id for w in report.workers] == ["h:1:aa"]  # the other one's heartbeat is stale


def test_status_command_prints_the_figures(status_rows, capsys):
    call_command("jobs", "status")
    out = capsys.readouterr().out
    header, default, emails = out.splitlines()[:3]
    assert header.split()[:5] == ["queue", "state", "waiting", "scheduled", "running"]
    assert default.split()[0] == "default" and default.split()[1:4] == ["3", "2", "1"]
    assert default.split()[-2:] == ["3", "1"]
    assert emails.split()[:2] == ["emails", "PAUSED"]
    assert "1 live worker(s)" in out and "h " in out
    call_command("jobs", "status", "--json")
    data = json.loads(capsys.readouterr().out)
    default = next(q for q in data["queues"] if q["name"] == "default")
    assert {
        k: default[k]
        for k in ("waiting", "scheduled", "running", "done_last_hour", "dead_last_hour")
    } == (_from_tables()["default"])
    assert [w["pid"] for w in data["workers"]] == [1]


@pytest.mark.slow
def test_live_workers_come_from_the_heartbeat_rows_of_real_workers(worker_process, capsys):
    env = {"JOBS_TEST_SETTINGS": json.dumps({"MAINTENANCE_INTERVAL": 0.3, "WORKER_EXPIRY": 5})}
    a = worker_process("--concurrency", "3", "--queue", "default", extra_env=env)
    b = worker_process("--concurrency", "1", "--queue", "emails", extra_env=env)
    wait_for(lambda: WorkerBeat.objects.count() == 2, message="both heartbeat rows")
    enqueue(jobs.record, {"label": "seen"})
    wait_for(lambda: CompletionMarker.objects.exists(), message="the job")
    workers = {w.pid: w for w in status.live_workers()}
    assert set(workers) == {a.pid, b.pid}
    assert (workers[a.pid].queues, workers[a.pid].concurrency) == (["default"], 3)
    assert (workers[b.pid].queues, workers[b.pid].concurrency) == (["emails"], 1)
    assert workers[a.pid].host == os.uname().nodename
    wait_for(
        lambda: WorkerBeat.objects.get(pid=a.pid).stats.get("outcomes", {}).get("succeeded") == 1,
        message="the counters in the heartbeat row",
    )
    call_command("jobs", "status")
    assert "2 live worker(s)" in capsys.readouterr().out
    a.signal(signal.SIGTERM)
    assert a.wait(timeout=20) == 0
    assert [w.pid for w in status.live_workers()] == [b.pid]  # a clean exit removes its row
    b.signal(signal.SIGTERM)
    assert b.wait(timeout=20) == 0


def test_status_says_to_start_a_worker_when_jobs_wait_for_none(capsys):
    # The first run: orders placed, runjobs never started.
    enqueue(jobs.noop, {})
    call_command("jobs", "status")
    out = capsys.readouterr().out
    assert "0 live worker(s)\n1 job(s) are waiting and no worker is running: start one with " in out
    assert "`python manage.py runjobs`" in out


def test_running_means_a_live_lease_everywhere():
    """One definition of running: a job whose lease expired is waiting (a claim takes it
    over first), in the state filter, the per-queue counts, the Tasks API's annotation
    and jobs status alike."""
    live = JobFactory(leased=True)
    expired = JobFactory(lease_expired=True)
    waiting = JobFactory()
    jobs_ = Job.objects.all()
    assert set(jobs_.running().values_list("id", flat=True)) == {live.id}
    assert set(jobs_.waiting().values_list("id", flat=True)) == {expired.id, waiting.id}
    assert set(jobs_.claimable().values_list("id", flat=True)) == {expired.id, waiting.id}
    states = dict(jobs_.with_state().values_list("id", "state"))
    assert states == {
        live.id: JobState.RUNNING,
        expired.id: JobState.WAITING,
        waiting.id: JobState.WAITING,
    }
    assert dict(jobs_.with_running().values_list("id", "running")) == {
        live.id: True,
        expired.id: False,
        waiting.id: False,
    }
    [counts] = jobs_.counts_by_queue()
    assert (counts["running"], counts["waiting"], counts["scheduled"]) == (1, 2, 0)


def test_blocked_workflow_steps_are_counted_apart_from_due_and_scheduled(status_rows, capsys):
    from django_jobs.models import blocked_until

    for _ in range(4):
        JobFactory(queue="default", run_at=blocked_until(), waiting_for=2)
    JobFactory(queue="emails", run_at=blocked_until(), waiting_for=1)
    by_name = {q.name: q for q in status.status().queues}
    default = by_name["default"]
    # The figures of status_rows are unchanged: a blocked step is neither due nor scheduled.
    assert (default.waiting, default.scheduled, default.running, default.blocked) == (3, 2, 1, 4)
    assert by_name["emails"].blocked == 1 and by_name["emails"].scheduled == 0
    call_command("jobs", "status")
    header, line = capsys.readouterr().out.splitlines()[:2]
    assert header.split()[:6] == ["queue", "state", "waiting", "scheduled", "running", "blocked"]
    assert line.split()[:5] == ["default", "3", "2", "1", "4"]
    call_command("jobs", "status", "--json")
    data = json.loads(capsys.readouterr().out)
    queues = {q["name"]: q for q in data["queues"]}
    assert queues["default"]["blocked"] == 4 and queues["default"]["scheduled"] == 2
    assert queues["emails"]["blocked"] == 1


def test_status_names_the_dead_lettered_parents_blocked_jobs_wait_for(capsys):
    from django_jobs.testing import drain

    call_command("jobs", "status", "--json")
    assert json.loads(capsys.readouterr().out)["dead_parents"] is None
    parents = [enqueue("tests.bb.fragile", {"label": f"p{i}"}) for i in range(4)]
    # p0 is waited for by two jobs, the others by one; p3 by nothing but a finished job.
    children = [enqueue("tests.bb.step", {"label": "c0"}, after=[parents[0]])]
    children += [enqueue("tests.bb.step", {"label": f"c{i}"}, after=[parents[i]]) for i in range(3)]
    drain()
    assert DeadLetter.objects.pending().count() == 4
    call_command("jobs", "status", "--json")
    dead = json.loads(capsys.readouterr().out)["dead_parents"]
    # The most waited-for first; p1 and p2 may have died in the same instant.
    assert (dead["jobs"], dead["letters"], dead["ids"][0]) == (4, 3, str(parents[0].id))
    assert set(dead["ids"][1:]) == {str(parents[1].id), str(parents[2].id)}
    call_command("jobs", "status")
    out = capsys.readouterr().out
    assert (
        "4 blocked job(s) wait for 3 dead-lettered parent(s): replay them (admin, or "
        f"`python manage.py replayjobs --id {' --id '.join(dead['ids'])}`)\n" in out
    )
    # Replayed and succeeding, a parent frees its children and leaves the hint.
    from tests.testapp.models import Audit

    for label in ("p0", "p1", "p2"):
        Audit.objects.create(label=f"bbheal|{label}")
    control.replay(DeadLetter.objects.filter(id__in=[p.id for p in parents[:3]]), by="test")
    drain()
    assert not Job.objects.exists()
    call_command("jobs", "status")
    assert "dead-lettered parent" not in capsys.readouterr().out


def test_status_escapes_terminal_control_characters_of_hand_written_rows(capsys):
    # A worker row written by hand (or by a hostile process with database access): clear
    # the screen, set the terminal's title, reverse the text after it.
    WorkerBeatFactory(host="h\x1b[2J\x1b]0;owned\x07", queues=["de\u202efault", "q\x9b1m"])
    call_command("jobs", "status")
    out = capsys.readouterr().out
    assert not [c for c in out if not c.isprintable() and c != "\n"]
    assert "h\\u001b[2J\\u001b]0;owned\\u0007" in out
    assert "de\\u202efault,q\\u009b1m" in out
    call_command("jobs", "status", "--json")
    workers = json.loads(capsys.readouterr().out)["workers"]
    assert workers[0]["host"] == "h\x1b[2J\x1b]0;owned\x07"  # JSON escapes them itself
