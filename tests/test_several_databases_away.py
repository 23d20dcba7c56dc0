"""One job database that cannot be read: the dashboard, the lists and the metrics go on.

With several job databases (DJANGO_JOBS["DATABASES"]), "jobs2" is made unreachable
(tests.conftest.unreachable: a port nothing listens on, a file that cannot exist on
SQLite); the pages that read it say so, and show the default database as usual.
"""

from __future__ import annotations

import uuid

import pytest
from django.db import connections

from django_jobs import enqueue
from tests.admin_fixtures import messages_of, url
from tests.conftest import throwaway_postgres_database, unreachable
from tests.testapp.jobs import record

pytestmark = pytest.mark.django_db(databases=["default", "jobs2"], transaction=True)


class TestDashboard:
    def test_the_other_database_shows_and_the_away_one_says_why(
        self, two_job_databases, admin_client_
    ):
        enqueue(record, {"label": "d"})
        with unreachable("jobs2"):
            response = admin_client_.get(url("dashboard"))
        assert response.status_code == 200
        default, jobs2 = response.context["sections"]
        assert default["alias"] == "default" and default["snap"].queues[0].waiting == 1
        assert "snap" not in jobs2
        assert jobs2["error"].startswith("could not read database 'jobs2': ")
        assert "\n" not in jobs2["error"] and len(jobs2["error"]) > len("could not read … ")
        text = response.content.decode()
        assert 'id="django-jobs-unreadable-jobs2"' in text
        assert 'id="django-jobs-queues"' in text and 'id="django-jobs-queues-jobs2"' not in text

    @pytest.mark.postgres  # a PostgreSQL database never migrated
    def test_a_database_not_migrated_says_so(self, two_job_databases, admin_client_):
        conn, default = connections["jobs2"], connections["default"].settings_dict
        kept = dict(conn.settings_dict)
        with throwaway_postgres_database(f"django_jobs_bare_{uuid.uuid4().hex[:12]}") as name:
            conn.close()
            conn.settings_dict.update(NAME=name, HOST=default["HOST"], PORT=default["PORT"])
            try:
                response = admin_client_.get(url("dashboard"))
            finally:
                conn.close()
                conn.settings_dict.clear()
                conn.settings_dict.update(kept)
        assert response.status_code == 200
        error = response.context["sections"][1]["error"]
        assert error.startswith("could not read database 'jobs2': relation "), error
        assert "does not exist" in error


class TestLists:
    @pytest.mark.parametrize("model", ["job", "deadletter", "workerbeat"])
    def test_a_list_of_the_away_database_answers_with_a_message(
        self, two_job_databases, admin_client_, model
    ):
        _answers_with_a_message(admin_client_, f"{url(model + '_changelist')}?database=jobs2")

    @pytest.mark.parametrize("page", ["change", "delete", "history"])
    def test_a_row_page_of_the_away_database_answers_with_a_message(
        self, two_job_databases, admin_client_, page
    ):
        job = enqueue(record, {"label": "j2"}, using="jobs2").id
        _answers_with_a_message(admin_client_, f"{url('job_' + page, job)}?database=jobs2")

    def test_the_default_list_still_opens(self, two_job_databases, admin_client_):
        job = enqueue(record, {"label": "d"}).id
        with unreachable("jobs2"):
            response = admin_client_.get(url("job_changelist"))
        assert response.status_code == 200
        assert [row.pk for row in response.context["cl"].result_list] == [job]


def _answers_with_a_message(client, page):
    """page, jobs2 away: a redirect to the app's page, which says why."""
    with unreachable("jobs2"):
        response = client.get(page)
        assert response.status_code == 302
        assert response["Location"] == "/admin/django_jobs/"
        shown = client.get(response["Location"])
    assert shown.status_code == 200
    [message] = messages_of(shown)
    assert message.startswith("could not read database 'jobs2': ")


class TestMetrics:
    @pytest.fixture(autouse=True)
    def _needs_prometheus(self):
        pytest.importorskip("prometheus_client")

    def test_the_scrape_has_the_others_and_says_which_is_down(
        self, two_job_databases, settings, client, caplog
    ):
        settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "METRICS_TOKEN": "t" * 20}
        enqueue(record, {"label": "d"})
        with unreachable("jobs2"):
            response = client.get("/metrics/jobs", headers={"Authorization": "Bearer " + "t" * 20})
        assert response.status_code == 200
        text = response.content.decode()
        assert 'django_jobs_database_up{database="default"} 1.0' in text
        assert 'django_jobs_database_up{database="jobs2"} 0.0' in text
        assert (
            'django_jobs_queue_jobs{database="default",queue="default",state="waiting"} 1.0' in text
        )
        assert 'database="jobs2",queue=' not in text
        assert 'django_jobs_workers{database="jobs2"}' not in text
        assert any("could not read job database 'jobs2'" in r.getMessage() for r in caplog.records)

    def test_both_up(self, two_job_databases):
        from django_jobs import metrics

        [up] = [f for f in metrics.JobsCollector().collect() if f.name == "django_jobs_database_up"]
        assert {s.labels["database"]: s.value for s in up.samples} == {"default": 1, "jobs2": 1}

    def test_one_database_has_an_unlabelled_up(self):
        from django_jobs import metrics

        [up] = [f for f in metrics.JobsCollector().collect() if f.name == "django_jobs_database_up"]
        assert [(s.labels, s.value) for s in up.samples] == [({}, 1)]

    def test_one_database_away_is_a_scrape_that_says_so(self, settings, client):
        settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "METRICS_TOKEN": "t" * 20}
        with unreachable("default"):
            response = client.get("/metrics/jobs", headers={"Authorization": "Bearer " + "t" * 20})
        assert response.status_code == 200
        text = response.content.decode()
        assert "django_jobs_database_up 0.0" in text
        assert "\ndjango_jobs_workers " not in text  # its HELP line only, no sample


class TestBurst:
    """A burst worker whose database fails every statement gives up; a serving one waits."""

    @pytest.fixture(autouse=True)
    def _short_patience(self, monkeypatch):
        from django_jobs.worker import runs

        monkeypatch.setattr(runs, "BURST_PATIENCE", 0.5)

    def test_a_burst_worker_gives_up_and_says_why(self, two_job_databases):
        from django_jobs.worker import DatabaseAway, Worker

        worker = Worker(database="jobs2", burst=True, poll_interval=0.05)
        with unreachable("jobs2"), pytest.raises(DatabaseAway) as raised:
            worker.run()
        assert str(raised.value).startswith("database 'jobs2' failed every statement for ")
        assert "a burst worker gives up" in str(raised.value)

    def test_the_other_database_is_drained_and_runjobs_exits_1(self, two_job_databases):
        from django.core.management import CommandError, call_command

        from django_jobs.models import CompletionMarker

        job = enqueue(record, {"label": "d"}).id
        with unreachable("jobs2"), pytest.raises(CommandError) as raised:
            call_command("runjobs", "--burst", "--poll-interval", "0.05")
        assert raised.value.returncode == 1
        assert "database 'jobs2' failed every statement" in str(raised.value)
        assert CompletionMarker.objects.using("default").filter(job_id=job).exists()

    def test_a_serving_worker_waits_for_its_database(self, two_job_databases):
        import threading

        from django_jobs.worker import Worker

        worker = Worker(database="jobs2", poll_interval=0.05, listen=False)
        failed = []

        def serve():
            try:
                worker.run()
            except BaseException as exc:  # noqa: BLE001 - what the test looks for
                failed.append(exc)

        with unreachable("jobs2"):
            thread = threading.Thread(target=serve)
            thread.start()
            thread.join(timeout=2.0)  # four times the patience of a burst worker
            still_serving = thread.is_alive()
            worker.stop()
            thread.join(timeout=10)
        assert still_serving and not thread.is_alive() and failed == []
