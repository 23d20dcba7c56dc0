"""Operating several job databases: `jobs`, prunejobs, replayjobs, control and the metrics.

Each command acts on every job database of DJANGO_JOBS["DATABASES"] unless --database
picks some, and names the database of each figure; with a single job database its
output is as it always was (tests/test_status.py and the others check that). "jobs2" is
a second PostgreSQL server on PostgreSQL runs, a second file on SQLite.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.core.management import ManagementUtility, call_command
from django.core.management.base import CommandError
from django.utils import timezone

from django_jobs import control, enqueue, workflow
from django_jobs.exceptions import InvalidJob
from django_jobs.models import (
    CompletionMarker,
    DeadLetter,
    DeadReason,
    Job,
    QueueState,
    Schedule,
)
from django_jobs.worker import Worker
from tests.conftest import unreachable
from tests.factories import DeadLetterFactory, JobFactory, MarkerFactory, WorkerBeatFactory
from tests.testapp.jobs import record, record_where

# "other" too: manage.py's system checks (ManagementUtility) ask every database.
pytestmark = pytest.mark.django_db(databases=["default", "jobs2", "other"], transaction=True)

BOTH = ["default", "jobs2"]


def jobs_on(alias, **filters):
    return Job.objects.using(alias).filter(**filters)


def saved(row, alias):
    """Save a factory-built row on database alias (the factories write on default)."""
    row.save(using=alias)
    return row


def run(capsys, *args):
    call_command(*args)
    return capsys.readouterr()


def section(out, alias):
    """The lines of `jobs status` (or `jobs schedules`) under the heading of database alias."""
    parts = re.split(r"^Job database '(\w+)'$", out, flags=re.MULTILINE)
    assert parts[0] == "", out  # nothing before the first heading
    found = dict(zip(parts[1::2], parts[2::2], strict=True))
    return found[alias]


def queue_row(text, queue):
    """The figures of a queue's row of the status table: [state..., waiting, ...] as words."""
    for line in text.splitlines():
        if line.split()[:1] == [queue]:
            return line.split()[1:]
    raise AssertionError(f"no row for {queue!r} in {text!r}")


def exit_code(capsys, *argv):
    """Run argv as manage.py does (the command-line path); return (code, stderr)."""
    with pytest.raises(SystemExit) as exit_:
        ManagementUtility(["manage.py", *argv]).execute()
    return exit_.value.code, capsys.readouterr().err


# ---- jobs status -------------------------------------------------------------------------


class TestStatus:
    def test_each_database_has_a_section_with_its_own_figures(self, two_job_databases, capsys):
        for _ in range(3):
            enqueue(record, {"label": "d"}, using="default")
        enqueue(record, {"label": "j"}, using="jobs2", queue="emails")
        saved(JobFactory.build(queue="emails", leased=True), "jobs2")
        saved(DeadLetterFactory.build(queue="emails"), "jobs2")
        control.pause(["emails"], using="jobs2")
        saved(WorkerBeatFactory.build(id="h:7:aa", pid=7), "jobs2")
        out = run(capsys, "jobs", "status").out
        default, jobs2 = section(out, "default"), section(out, "jobs2")
        # queue, state, waiting, scheduled, running, blocked, oldest wait, done 1h, dead 1h
        assert queue_row(default, "default")[:4] == ["3", "0", "0", "0"]
        assert queue_row(default, "emails")[:4] == ["0", "0", "0", "0"]
        assert queue_row(jobs2, "default")[:4] == ["0", "0", "0", "0"]
        emails = queue_row(jobs2, "emails")
        assert emails[:5] == ["PAUSED", "1", "0", "1", "0"]
        assert emails[-2:] == ["0", "1"]  # done and dead in the last hour
        assert "0 live worker(s)" in default and "1 live worker(s)" in jobs2
        assert "last seen" not in default and "last seen" in jobs2
        # The hint to start a worker is the database's own: jobs2 has one, default none.
        assert "no worker is running" in default and "no worker is running" not in jobs2

    def test_json_carries_the_database_of_each_report(self, two_job_databases, capsys):
        enqueue(record, {"label": "j"}, using="jobs2")
        saved(WorkerBeatFactory.build(id="h:8:bb", pid=8), "jobs2")
        data = json.loads(run(capsys, "jobs", "status", "--json").out)
        assert [d["database"] for d in data["databases"]] == BOTH
        by = {d["database"]: d for d in data["databases"]}
        waiting = {alias: {q["name"]: q["waiting"] for q in d["queues"]} for alias, d in by.items()}
        assert waiting["default"]["default"] == 0 and waiting["jobs2"]["default"] == 1
        assert [w["id"] for w in by["jobs2"]["workers"]] == ["h:8:bb"]
        assert by["default"]["workers"] == []
        assert all(q["declared"] in (True, False) for q in by["jobs2"]["queues"])

    def test_database_picks_one(self, two_job_databases, capsys):
        enqueue(record, {"label": "j"}, using="jobs2")
        out = run(capsys, "jobs", "status", "--database", "jobs2").out
        assert out.startswith("Job database 'jobs2'\n")
        assert "Job database 'default'" not in out
        assert queue_row(section(out, "jobs2"), "default")[0] == "1"
        data = json.loads(run(capsys, "jobs", "status", "--json", "--database", "jobs2").out)
        assert [d["database"] for d in data["databases"]] == ["jobs2"]

    def test_an_alias_that_is_not_a_job_database_is_refused(self, two_job_databases, capsys):
        with pytest.raises(CommandError, match=r"--database 'other' is not a job database") as e:
            call_command("jobs", "status", "--database", "other")
        assert "holds 'default', 'jobs2'" in str(e.value)
        code, err = exit_code(capsys, "jobs", "status", "--database", "nowhere")
        assert code == 2 and "'nowhere' is not a job database" in err

    def test_tagged_counts_per_database(self, two_job_databases, capsys):
        enqueue(record, {"label": "a"}, tags=["eu"], using="default")
        enqueue(record, {"label": "b"}, tags=["eu"], using="jobs2")
        enqueue(record, {"label": "c"}, tags=["eu"], using="jobs2")
        enqueue(record, {"label": "d"}, tags=["us"], using="jobs2")
        out = run(capsys, "jobs", "status", "--tag", "eu").out
        assert queue_row(section(out, "default"), "default")[0] == "1"
        assert queue_row(section(out, "jobs2"), "default")[0] == "2"
        data = json.loads(run(capsys, "jobs", "status", "--tag", "eu", "--json").out)
        assert {d["database"]: d["queues"][0]["waiting"] for d in data["databases"]} == {
            "default": 1,
            "jobs2": 2,
        }
        assert all(d["tags"] == ["eu"] for d in data["databases"])

    def test_a_single_job_database_keeps_its_output(self, settings, capsys):
        settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "DATABASES": ["default"]}
        enqueue(record, {"label": "a"})
        out = run(capsys, "jobs", "status").out
        assert "Job database" not in out and out.startswith("queue ")
        data = json.loads(run(capsys, "jobs", "status", "--json").out)
        assert "databases" not in data and "database" not in data and "queues" in data
        with pytest.raises(CommandError, match=r"'jobs2' is not a job database: .* 'default'$"):
            call_command("jobs", "status", "--database", "jobs2")


# ---- pause and resume --------------------------------------------------------------------


class TestPauseResume:
    def test_pause_pauses_the_queue_in_every_database(self, two_job_databases, capsys):
        enqueue(record_where, {"label": "d"}, using="default")
        enqueue(record_where, {"label": "j"}, using="jobs2")
        out = run(capsys, "jobs", "pause", "default", "--reason", "incident").out
        assert out.startswith(
            "paused 1 queue(s) on database 'default', 1 queue(s) on database 'jobs2'; "
        )
        for alias in BOTH:
            row = QueueState.objects.using(alias).get(name="default")
            assert (row.paused, row.reason, row.paused_by) == (True, "incident", "manage.py jobs")
        call_command("runjobs", "--burst")  # a worker per database: neither claims
        assert jobs_on("default").count() == 1 and jobs_on("jobs2").count() == 1

    def test_resume_of_one_database_lets_only_its_workers_claim(self, two_job_databases, capsys):
        enqueue(record_where, {"label": "d"}, using="default")
        enqueue(record_where, {"label": "j"}, using="jobs2")
        run(capsys, "jobs", "pause", "default")
        out = run(capsys, "jobs", "resume", "default", "--database", "jobs2").out
        assert out == "resumed 1 queue(s) on database 'jobs2'\n"
        assert QueueState.objects.using("default").get(name="default").paused
        assert not QueueState.objects.using("jobs2").get(name="default").paused
        call_command("runjobs", "--burst")
        assert jobs_on("default").count() == 1 and not jobs_on("jobs2").exists()
        out = run(capsys, "jobs", "resume", "default").out
        assert out == "resumed 1 queue(s) on database 'default', 0 queue(s) on database 'jobs2'\n"

    def test_pause_with_database_leaves_the_others_alone(self, two_job_databases, capsys):
        call_command("jobs", "pause", "emails", "--database", "jobs2")
        assert control.paused_queues("jobs2") == {"emails"}
        assert control.paused_queues("default") == set()

    def test_an_undeclared_queue_with_jobs_in_one_database_may_be_paused(
        self, two_job_databases, capsys
    ):
        enqueue(record, {"label": "a"}, queue="adhoc", using="jobs2")
        with pytest.raises(CommandError, match=r"no handler declares queue\(s\) 'adhoc'"):
            call_command("jobs", "pause", "adhoc", "--database", "default")
        assert not QueueState.objects.using("default").filter(name="adhoc").exists()
        call_command("jobs", "pause", "adhoc")
        assert all(control.paused_queues(alias) == {"adhoc"} for alias in BOTH)
        # Resumed, its row goes where it holds no jobs (it existed for the pause) and stays
        # where it does.
        call_command("jobs", "resume", "adhoc")
        assert not QueueState.objects.using("default").filter(name="adhoc").exists()
        assert QueueState.objects.using("jobs2").filter(name="adhoc", paused=False).exists()

    def test_control_using(self, two_job_databases):
        assert control.pause(["default"]) == 2  # running in both before
        assert control.pause(["default"], using="jobs2") == 0  # paused already
        assert control.resume(["default"], using="default") == 1
        assert control.paused_queues("default") == set()
        assert control.paused_queues("jobs2") == {"default"}
        assert control.resume(["default"]) == 1
        with pytest.raises(InvalidJob, match=r"using='other' is not a job database"):
            control.pause(["default"], using="other")
        with pytest.raises(InvalidJob, match=r"using='other' is not a job database"):
            control.resume(["default"], using="other")
        enqueue(record, {"label": "a"}, queue="adhoc", using="jobs2")
        assert control.unknown_queues(["adhoc", "later"]) == ["later"]
        assert control.unknown_queues(["adhoc", "later"], using="default") == ["adhoc", "later"]


# ---- cancel ------------------------------------------------------------------------------


class TestCancel:
    def test_each_job_is_cancelled_in_the_database_that_holds_it(self, two_job_databases, capsys):
        here = enqueue(record, {"label": "d"}, using="default")
        there = enqueue(record, {"label": "j"}, using="jobs2", delay=3600)
        running = saved(JobFactory.build(leased=True), "jobs2")
        result = run(capsys, "jobs", "cancel", str(here.id), str(there.id), str(running.id))
        assert result.out.splitlines() == [
            "database 'default': cancelled 1 job(s) (1 waiting); "
            "asked the workers of 0 running job(s) to stop them",
            "database 'jobs2': cancelled 1 job(s) (1 scheduled); "
            "asked the workers of 1 running job(s) to stop them",
        ]
        assert result.err == ""
        assert DeadLetter.objects.using("default").get(id=here.id).reason == DeadReason.CANCELLED
        assert DeadLetter.objects.using("jobs2").get(id=there.id).reason == DeadReason.CANCELLED
        assert not DeadLetter.objects.using("default").filter(id=there.id).exists()
        assert jobs_on("jobs2", id=running.id, cancel_requested_at__isnull=False).exists()

    def test_database_limits_where_jobs_are_looked_for(self, two_job_databases, capsys):
        there = enqueue(record, {"label": "j"}, using="jobs2")
        result = run(capsys, "jobs", "cancel", str(there.id), "--database", "default")
        assert result.out.startswith("database 'default': cancelled 0 job(s)")
        assert "1 job(s) were not live" in result.err
        assert jobs_on("jobs2", id=there.id).exists()

    def test_control_cancel_finds_the_job_or_keeps_to_using(self, two_job_databases):
        there = enqueue(record, {"label": "j"}, using="jobs2")
        assert control.cancel([there.id], using="default").cancelled == 0
        assert jobs_on("jobs2", id=there.id).exists()
        outcome = control.cancel([there.id], by="ops")
        assert (outcome.cancelled, outcome.waiting, outcome.requested) == (1, 1, 0)
        assert DeadLetter.objects.using("jobs2").get(id=there.id).reason == DeadReason.CANCELLED
        with pytest.raises(InvalidJob, match=r"not a job database"):
            control.cancel([there.id], using="other")

    def test_cancel_by_tag_spans_the_databases(self, two_job_databases, capsys):
        enqueue(record, {"label": "a"}, tags=["bad"], using="default")
        enqueue(record, {"label": "b"}, tags=["bad"], using="jobs2")
        keep = enqueue(record, {"label": "c"}, tags=["good"], using="jobs2")
        out = run(capsys, "jobs", "cancel", "--tag", "bad").out
        assert "database 'default': cancelled 1 job(s)" in out
        assert "database 'jobs2': cancelled 1 job(s)" in out
        assert list(Job.objects.using("jobs2").values_list("id", flat=True)) == [keep.id]
        assert not jobs_on("default").exists()
        with pytest.raises(CommandError, match=r"no live job tagged 'good'"):
            call_command("jobs", "cancel", "--tag", "good", "--database", "default")

    def test_cancel_workflow_in_the_database_that_holds_it(self, two_job_databases, capsys):
        with workflow(name="order-9", using="jobs2") as w:
            first = w.enqueue(record, {"label": "a"})
            w.enqueue(record, {"label": "b"}, after=[first])
        out = run(capsys, "jobs", "cancel", "--workflow", "order-9").out
        assert out == (
            "database 'jobs2': workflow 'order-9': cancelled 2 job(s) (1 waiting, 1 blocked); "
            "asked the workers of 0 running job(s) to stop them\n"
        )
        assert not jobs_on("jobs2").exists()
        assert DeadLetter.objects.using("jobs2").count() == 2
        with pytest.raises(CommandError, match=r"no workflow named 'order-9'"):
            call_command("jobs", "cancel", "--workflow", "order-9", "--database", "default")
        with workflow(name="order-10", using="jobs2") as w:
            w.enqueue(record, {"label": "a"})
        assert control.cancel_workflow("order-10", using="default").cancelled == 0
        assert control.cancel_workflow("order-10").cancelled == 1


# ---- schedules ---------------------------------------------------------------------------

# In every job database ("*"): a schedule fires in DATABASE alone unless it says so.
NIGHTLY = {"nightly": {"cron": "0 3 * * *", "job": "tests.noop", "database": "*"}}


class TestSchedules:
    def test_schedules_are_listed_and_switched_per_database(
        self, two_job_databases, settings, capsys
    ):
        settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "SCHEDULES": NIGHTLY}
        out = run(capsys, "jobs", "schedules").out
        for alias in BOTH:
            assert "nightly" in section(out, alias) and "enabled" in section(out, alias)
        out = run(capsys, "jobs", "disable", "nightly", "--database", "jobs2").out
        assert out == "disabled 1 schedule(s) on database 'jobs2'\n"
        assert Schedule.objects.using("default").get(name="nightly").enabled
        assert not Schedule.objects.using("jobs2").get(name="nightly").enabled
        out = run(capsys, "jobs", "schedules").out
        assert "disabled" in section(out, "jobs2") and "disabled" not in section(out, "default")
        out = run(capsys, "jobs", "enable", "nightly").out
        assert out == (
            "enabled 0 schedule(s) on database 'default', 1 schedule(s) on database 'jobs2'\n"
        )
        with pytest.raises(CommandError, match=r"no schedule named 'daily'"):
            call_command("jobs", "disable", "daily")


# ---- prunejobs ---------------------------------------------------------------------------


class TestPrune:
    @pytest.fixture
    def old_rows(self, two_job_databases):
        old = timezone.now() - timedelta(days=30)
        MarkerFactory(completed_at=old)
        for _ in range(2):
            saved(MarkerFactory.build(completed_at=old), "jobs2")
        saved(MarkerFactory.build(), "jobs2")  # young: kept
        saved(DeadLetterFactory.build(dead_at=old), "jobs2")

    def test_every_database_is_pruned_with_a_line_each(self, old_rows, capsys):
        out = run(capsys, "prunejobs", "--markers", "7d", "--dead-letters", "7d").out
        lines = out.splitlines()
        assert lines[0].startswith("database 'default': deleted 1 completion marker(s), 0 dead")
        assert lines[1].startswith("database 'jobs2': deleted 2 completion marker(s), 1 dead")
        assert CompletionMarker.objects.using("jobs2").count() == 1
        assert not CompletionMarker.objects.using("default").exists()
        assert not DeadLetter.objects.using("jobs2").exists()

    def test_database_and_dry_run(self, old_rows, capsys):
        out = run(capsys, "prunejobs", "--dry-run", "--markers", "7d", "--database", "jobs2").out
        assert out.startswith("database 'jobs2': would delete 2 completion marker(s)")
        assert len(out.splitlines()) == 1
        call_command("prunejobs", "--markers", "7d", "--database", "jobs2")
        assert CompletionMarker.objects.using("default").count() == 1  # left alone
        assert CompletionMarker.objects.using("jobs2").count() == 1

    def test_an_alias_that_is_not_a_job_database_is_refused(self, two_job_databases, capsys):
        code, err = exit_code(capsys, "prunejobs", "--database", "other")
        assert code == 2 and "'other' is not a job database" in err


# ---- replayjobs --------------------------------------------------------------------------


class TestReplay:
    @pytest.fixture
    def letters(self, two_job_databases):
        """Dead letters in both databases, dead 4, 3, 2 and 1 hours ago, alternately."""
        now = timezone.now()
        found = {}
        for hours, alias in ((4, "jobs2"), (3, "default"), (2, "jobs2"), (1, "default")):
            letter = DeadLetterFactory.build(
                dead_at=now - timedelta(hours=hours), payload=json.dumps({"label": f"{hours}h"})
            )
            found[hours] = saved(letter, alias)
        return found

    def test_each_letter_is_replayed_in_its_database(self, letters, capsys):
        out = run(capsys, "replayjobs", "--all").out
        assert out.splitlines() == [
            "database 'default': 2 replayed.",
            "database 'jobs2': 2 replayed.",
        ]
        for letter in letters.values():
            alias = letter._state.db
            replayed = DeadLetter.objects.using(alias).get(id=letter.id)
            assert jobs_on(alias, id=replayed.replay_job_id).exists()
        call_command("runjobs", "--burst")
        assert not jobs_on("default").exists() and not jobs_on("jobs2").exists()

    def test_limit_takes_the_oldest_across_the_databases(self, letters, capsys):
        call_command("replayjobs", "--all", "--limit", "2")
        replayed = {
            alias: list(
                DeadLetter.objects.using(alias)
                .filter(replayed_at__isnull=False)
                .values_list("id", flat=True)
            )
            for alias in BOTH
        }
        assert replayed == {"jobs2": [letters[4].id], "default": [letters[3].id]}

    def test_dry_run_lists_the_database_of_each_letter(self, letters, capsys):
        out = run(capsys, "replayjobs", "--all", "--dry-run").out.splitlines()
        assert out[0] == "Dry run: 4 dead letter(s) would be replayed; nothing was changed."
        assert [line.split()[0] for line in out[1:]] == [str(letters[h].id) for h in (4, 3, 2, 1)]
        assert [line.rsplit("database=", 1)[1] for line in out[1:]] == [
            "jobs2",
            "default",
            "jobs2",
            "default",
        ]
        assert not jobs_on("default").exists() and not jobs_on("jobs2").exists()

    def test_id_finds_the_letter_and_database_narrows(self, letters, capsys):
        wanted = str(letters[2].id)
        out = run(capsys, "replayjobs", "--id", wanted, "--database", "default").out
        assert out.splitlines() == ["database 'default': 0 replayed."]
        out = run(capsys, "replayjobs", "--id", wanted).out
        assert out.splitlines() == [
            "database 'default': 0 replayed.",
            "database 'jobs2': 1 replayed.",
        ]
        assert jobs_on("jobs2").count() == 1

    def test_an_alias_that_is_not_a_job_database_is_refused(self, two_job_databases, capsys):
        code, err = exit_code(capsys, "replayjobs", "--all", "--database", "other")
        assert code == 2 and "'other' is not a job database" in err


# ---- metrics -----------------------------------------------------------------------------


def scrape_samples(alias=None):
    """The samples of the collector's families, by (name, sorted labels).

    django_jobs_enqueued_total (the process's own counter, once metrics.install() has run
    in this process) names no database: it counts the enqueues of the process.
    """
    from django_jobs import metrics

    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in metrics.JobsCollector(alias).collect()
        for sample in family.samples
        if not sample.name.startswith("django_jobs_enqueued")
    }


class TestMetrics:
    @pytest.fixture(autouse=True)
    def _needs_prometheus(self):
        pytest.importorskip("prometheus_client")

    def test_every_series_names_its_database(self, two_job_databases):
        enqueue(record, {"label": "d"}, using="default")
        for _ in range(2):
            enqueue(record, {"label": "j"}, using="jobs2")
        control.pause(["emails"], using="jobs2")
        stats = {"claimed": 5, "started": 5, "outcomes": {"succeeded": 5}}
        saved(WorkerBeatFactory.build(id="h:3:cc", pid=3, stats=stats), "jobs2")
        samples = scrape_samples()

        def value(name, **labels):
            return samples[(name, tuple(sorted(labels.items())))]

        waiting = "django_jobs_queue_jobs"
        assert value(waiting, database="default", queue="default", state="waiting") == 1
        assert value(waiting, database="jobs2", queue="default", state="waiting") == 2
        assert value("django_jobs_queue_paused", database="jobs2", queue="emails") == 1
        assert value("django_jobs_queue_paused", database="default", queue="emails") == 0
        assert value("django_jobs_workers", database="jobs2") == 1
        assert value("django_jobs_workers", database="default") == 0
        claimed = "django_jobs_jobs_claimed_total"
        assert value(claimed, database="jobs2", host="h", worker="h:3:cc") == 5
        assert all(dict(labels).get("database") in BOTH for _, labels in samples)

    def test_one_database_alone(self, two_job_databases):
        enqueue(record, {"label": "j"}, using="jobs2")
        samples = scrape_samples("jobs2")
        assert {dict(labels).get("database") for _, labels in samples} == {"jobs2"}

    def test_the_view_scrapes_every_database(self, two_job_databases, settings, client):
        settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "METRICS_TOKEN": "t" * 20}
        enqueue(record, {"label": "j"}, using="jobs2")
        body = client.get("/metrics/jobs", headers={"Authorization": "Bearer " + "t" * 20})
        text = body.content.decode()
        assert (
            'django_jobs_queue_jobs{database="jobs2",queue="default",state="waiting"} 1.0' in text
        )
        assert 'django_jobs_workers{database="default"} 0.0' in text

    def test_a_single_job_database_has_no_database_label(self):
        enqueue(record, {"label": "a"})
        WorkerBeatFactory(id="h:4:dd", pid=4)
        samples = scrape_samples()
        assert samples[("django_jobs_workers", ())] == 1
        assert samples[("django_jobs_queue_jobs", (("queue", "default"), ("state", "waiting")))]
        assert not any("database" in dict(labels) for _, labels in samples)


def test_worker_on_jobs2_does_not_claim_a_queue_paused_there(two_job_databases):
    """What pause writes in jobs2 is what jobs2's workers read (not default's rows)."""
    enqueue(record_where, {"label": "j"}, using="jobs2")
    control.pause(["default"], using="jobs2")
    Worker(database="jobs2", burst=True).run()
    assert jobs_on("jobs2").count() == 1
    control.resume(["default"])
    Worker(database="jobs2", burst=True).run()
    assert not jobs_on("jobs2").exists()


def test_status_shows_the_other_databases_when_one_is_away(two_job_databases, capsys):
    enqueue(record, {"label": "d"}, using="default")
    with unreachable("jobs2"):
        with pytest.raises(CommandError, match=r"could not read job database\(s\) 'jobs2'"):
            call_command("jobs", "status")
        out = capsys.readouterr().out
        assert queue_row(section(out, "default"), "default")[0] == "1"
        assert section(out, "jobs2").startswith("\ncould not read it: ")
        with pytest.raises(CommandError, match=r"'jobs2'"):
            call_command("jobs", "status", "--json")
        data = json.loads(capsys.readouterr().out)
        by = {d["database"]: d for d in data["databases"]}
        assert by["default"]["queues"] and by["jobs2"]["error"]
    out = run(capsys, "jobs", "status").out  # back: no error
    assert "could not read" not in out


def test_a_schedule_of_database_alone_is_listed_there_only(two_job_databases, settings, capsys):
    settings.DJANGO_JOBS = {
        **settings.DJANGO_JOBS,
        "SCHEDULES": {"nightly": {"cron": "0 3 * * *", "job": "tests.noop"}},
    }
    out = run(capsys, "jobs", "schedules").out
    assert "nightly" in section(out, "default")
    assert "nightly" not in section(out, "jobs2")
