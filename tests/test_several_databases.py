"""Jobs in several databases (DJANGO_JOBS["DATABASES"]): where enqueue writes, what workers serve.

"jobs2" is a second PostgreSQL server on PostgreSQL runs (dev.py starts the cluster), a
second file on SQLite and a second database on MariaDB.
"""

from __future__ import annotations

import contextlib
import json
import re
from datetime import timedelta
from pathlib import Path

import hypothesis
import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections, transaction
from django.test import Client, override_settings
from hypothesis import strategies as st

from django_jobs import conf, enqueue, enqueue_many, enqueue_on_commit, testing, workflow
from django_jobs.exceptions import InvalidJob
from django_jobs.models import CompletionMarker, Job, Schedule
from django_jobs.routers import JobsRouter
from django_jobs.worker import Worker
from django_jobs.worker.ticker import Ticker, db_now, sync
from tests.testapp.jobs import record, record_where
from tests.testapp.models import Audit, Order

pytestmark = pytest.mark.django_db(databases=["default", "jobs2", "other"], transaction=True)


def jobs_on(alias, **filters):
    return Job.objects.using(alias).filter(**filters)


def by_label(label):
    """The order's route: jobs whose label starts with "eu" go on jobs2."""
    return lambda name, queue, payload: "jobs2" if str(payload["label"]).startswith(label) else None


class TestSettings:
    def test_databases_put_database_first(self, settings):
        settings.DJANGO_JOBS = {"DATABASES": ["jobs2", "default"], "DATABASE": "default"}
        assert conf.databases() == ("default", "jobs2")

    def test_only_databases_makes_its_first_alias_the_default(self, settings):
        settings.DJANGO_JOBS = {"DATABASES": ["jobs2", "default"]}
        assert conf.database() == "jobs2"
        assert conf.databases() == ("jobs2", "default")

    def test_one_database_when_databases_is_not_set(self, settings):
        settings.DJANGO_JOBS = {"DATABASE": "other"}
        assert conf.databases() == ("other",)

    def test_the_router_migrates_on_every_job_database_only(self, two_job_databases):
        router = JobsRouter()
        assert router.allow_migrate("default", "django_jobs")
        assert router.allow_migrate("jobs2", "django_jobs")
        assert not router.allow_migrate("other", "django_jobs")

    def test_a_row_loaded_from_a_job_database_is_saved_back_there(self, two_job_databases):
        enqueue(record, {"label": "x"}, using="jobs2")
        job = Job.objects.using("jobs2").get()
        assert JobsRouter().db_for_write(Job, instance=job) == "jobs2"
        job.priority = 7
        job.save()
        assert Job.objects.using("jobs2").get().priority == 7
        assert not Job.objects.using("default").exists()


class TestWriting:
    def test_using_names_the_database(self, two_job_databases):
        result = enqueue(record, {"label": "a"}, using="jobs2")
        assert jobs_on("jobs2", id=result.id).exists()
        assert not jobs_on("default").exists()

    def test_using_an_alias_without_job_tables_is_refused(self, two_job_databases):
        with pytest.raises(InvalidJob, match=r"using='other' is not a job database"):
            enqueue(record, {"label": "a"}, using="other")
        with pytest.raises(InvalidJob, match=r"not a job database"):
            enqueue_on_commit(record, {"label": "a"}, using="nowhere")

    def test_with_one_database_using_must_be_it(self):
        enqueue(record, {"label": "a"}, using="default")
        with pytest.raises(InvalidJob, match=r"using='jobs2' is not a job database"):
            enqueue(record, {"label": "a"}, using="jobs2")

    def test_no_transaction_open_writes_on_database(self, two_job_databases):
        enqueue_on_commit(record, {"label": "a"})
        assert jobs_on("default").count() == 1

    def test_the_open_transaction_decides(self, two_job_databases):
        with transaction.atomic(using="jobs2"):
            result = enqueue_on_commit(record_where, {"label": "eu-1"})
            assert jobs_on("jobs2", id=result.id).exists()
        assert jobs_on("jobs2", id=result.id).exists()
        assert not jobs_on("default").exists()

    def test_a_rollback_on_that_database_leaves_no_job(self, two_job_databases):
        with pytest.raises(RuntimeError), transaction.atomic(using="jobs2"):
            Order.objects.using("jobs2").create(item="book")
            enqueue_on_commit(record_where, {"label": "eu-1"})
            raise RuntimeError("rolled back")
        assert not jobs_on("jobs2").exists()
        assert not Order.objects.using("jobs2").exists()

    def test_the_innermost_block_decides(self, two_job_databases):
        with transaction.atomic(using="jobs2"), transaction.atomic(using="default"):
            with transaction.atomic(using="default"):  # deeper on default
                deeper = enqueue_on_commit(record, {"label": "deeper"})
        with transaction.atomic(using="default"), transaction.atomic(using="jobs2"):
            with transaction.atomic(using="jobs2"):
                inner = enqueue_on_commit(record, {"label": "inner"})
        assert jobs_on("default", id=deeper.id).exists()
        assert jobs_on("jobs2", id=inner.id).exists()

    def test_equally_nested_another_job_database_wins_over_database(self, two_job_databases):
        # What a view under ATOMIC_REQUESTS (on default) that opens atomic(using="jobs2")
        # holds: Django does not record which of the two was opened first.
        with transaction.atomic(using="default"), transaction.atomic(using="jobs2"):
            result = enqueue_on_commit(record_where, {"label": "eu-1"})
        assert jobs_on("jobs2", id=result.id).exists()

    def test_equally_nested_other_job_databases_take_the_route(self, settings):
        settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "DATABASES": ["default", "jobs2", "other"]}
        with transaction.atomic(using="jobs2"), transaction.atomic(using="other"):
            with pytest.raises(InvalidJob, match=r"'jobs2', 'other', equally nested: pass using="):
                enqueue_on_commit(record, {"label": "a"})
            explicit = enqueue_on_commit(record, {"label": "a"}, using="other")
            settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "ROUTE": by_label("eu")}
            routed = enqueue_on_commit(record, {"label": "eu-1"})
        assert jobs_on("other", id=explicit.id).exists()
        assert jobs_on("jobs2", id=routed.id).exists()

    def test_a_block_on_an_alias_without_job_tables_is_still_refused(self, two_job_databases):
        with transaction.atomic(using="other"):
            with pytest.raises(InvalidJob, match=r"open on database 'other'"):
                enqueue_on_commit(record, {"label": "a"})
        assert not jobs_on("default").exists() and not jobs_on("jobs2").exists()

    def test_commit_of_a_job_database_writes_the_job_there(self, two_job_databases):
        with transaction.atomic(using="jobs2"):
            result = enqueue_on_commit(record, {"label": "a"}, commit_of="jobs2")
            assert jobs_on("jobs2", id=result.id).exists()  # in the transaction, not after

    def test_route_places_jobs_without_a_transaction(self, two_job_databases, settings):
        settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "ROUTE": by_label("eu")}
        eu = enqueue(record, {"label": "eu-7"})
        us = enqueue(record, {"label": "us-7"})
        assert jobs_on("jobs2", id=eu.id).exists()
        assert jobs_on("default", id=us.id).exists()

    def test_route_as_a_dotted_path(self, two_job_databases, settings):
        settings.DJANGO_JOBS = {
            **settings.DJANGO_JOBS,
            "ROUTE": "tests.test_several_databases.route_everything_to_jobs2",
        }
        result = enqueue(record, {"label": "x"})
        assert jobs_on("jobs2", id=result.id).exists()

    def test_route_returning_an_alias_without_job_tables_is_refused(
        self, two_job_databases, settings
    ):
        settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "ROUTE": lambda *_: "other"}
        with pytest.raises(InvalidJob, match=r"ROUTE'\] returned 'other' for job 'tests.record'"):
            enqueue(record, {"label": "x"})

    def test_enqueue_many_spread_by_the_route_keeps_the_order(self, two_job_databases, settings):
        settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "ROUTE": by_label("eu")}
        labels = ["eu-0", "us-1", "eu-2", "us-3", "us-4"]
        results = enqueue_many(record, [{"label": label} for label in labels])
        assert [r.name for r in results] == ["tests.record"] * 5
        on_jobs2 = set(jobs_on("jobs2").values_list("id", flat=True))
        assert [r.id in on_jobs2 for r in results] == [True, False, True, False, False]
        assert jobs_on("default").count() == 3

    def test_dedupe_keys_are_per_database(self, two_job_databases):
        first = enqueue(record, {"label": "a"}, key="k", using="default")
        second = enqueue(record, {"label": "a"}, key="k", using="jobs2")
        again = enqueue(record, {"label": "a"}, key="k", using="jobs2")
        assert first.id != second.id
        assert again.duplicate and again.id == second.id

    def test_a_workflow_lives_in_one_database(self, two_job_databases):
        with workflow(name="order-1", using="jobs2") as w:
            a = w.enqueue(record, {"label": "a"})
            w.enqueue(record, {"label": "b"}, after=[a])
        assert jobs_on("jobs2").count() == 2
        assert not jobs_on("default").exists()

    def test_a_workflow_follows_the_open_transaction(self, two_job_databases):
        with transaction.atomic(using="jobs2"), workflow(name="order-2") as w:
            w.enqueue(record, {"label": "a"})
        assert jobs_on("jobs2").count() == 1

    def test_a_view_writes_its_order_and_job_together(self, two_job_databases):
        client = Client(raise_request_exception=False)
        response = client.post("/orders/jobs2/", {"item": "book"})
        assert response.status_code == 200
        order = Order.objects.using("jobs2").get()
        job = jobs_on("jobs2").get()
        assert json.loads(job.payload) == {"label": f"order-{order.pk}"}
        response = client.post("/orders/jobs2/", {"item": "book", "fail": "1"})
        assert response.status_code == 500
        assert Order.objects.using("jobs2").count() == 1  # neither the order nor its job
        assert jobs_on("jobs2").count() == 1
        assert not jobs_on("default").exists() and not Order.objects.exists()


def route_everything_to_jobs2(name, queue, payload):
    return "jobs2"


class TestRunning:
    def test_a_worker_runs_the_jobs_of_its_database_there(self, two_job_databases):
        enqueue(record_where, {"label": "one"}, using="jobs2")
        enqueue(record_where, {"label": "two"}, using="default")
        Worker(database="jobs2", burst=True, concurrency=2).run()
        assert list(Audit.objects.using("jobs2").values_list("label", flat=True)) == ["one"]
        assert CompletionMarker.objects.using("jobs2").count() == 1
        assert not Audit.objects.using("default").exists()
        assert jobs_on("default").count() == 1

    def test_runjobs_serves_every_job_database(self, two_job_databases):
        for n in range(20):
            enqueue(record_where, {"label": f"d{n}"}, using="default")
            enqueue(record_where, {"label": f"j{n}"}, using="jobs2")
        call_command("runjobs", "--burst", "--concurrency", "2")
        assert Audit.objects.using("default").count() == 20
        assert Audit.objects.using("jobs2").count() == 20
        assert not jobs_on("default").exists() and not jobs_on("jobs2").exists()

    def test_runjobs_database_picks_some(self, two_job_databases):
        enqueue(record_where, {"label": "d"}, using="default")
        enqueue(record_where, {"label": "j"}, using="jobs2")
        call_command("runjobs", "--burst", "--database", "jobs2")
        assert jobs_on("default").count() == 1
        assert not jobs_on("jobs2").exists()

    def test_runjobs_refuses_an_alias_that_is_not_a_job_database(self, two_job_databases):
        with pytest.raises(CommandError, match=r"--database 'other' is not a job database"):
            call_command("runjobs", "--burst", "--database", "other")

    def test_the_context_names_the_database(self, two_job_databases):
        seen = []

        from django_jobs import job

        @job(name="tests.where_am_i")
        def where_am_i(payload, ctx):
            seen.append(ctx.database)

        try:
            enqueue(where_am_i, using="jobs2")
            enqueue(where_am_i, using="default")
            call_command("runjobs", "--burst")
        finally:
            from django_jobs import registry

            registry.unregister("tests.where_am_i")
        assert sorted(seen) == ["default", "jobs2"]


@override_settings(DJANGO_JOBS={"DATABASES": ["default", "jobs2"], "DATABASE": "jobs2"})
def test_database_may_be_any_alias_of_databases():
    result = enqueue(record, {"label": "x"})
    assert jobs_on("jobs2", id=result.id).exists()


class TestSchedules:
    """A schedule fires once per tick in the database it names, not once per database."""

    def _tick_everywhere(self, schedules_setting, settings):
        settings.DJANGO_JOBS = {
            **settings.DJANGO_JOBS,
            "DATABASES": ["default", "jobs2"],
            "SCHEDULES": schedules_setting,
        }
        for alias in ("default", "jobs2"):
            sync(alias)
            now = db_now(alias)
            Schedule.objects.using(alias).update(
                created_at=now - timedelta(hours=1), last_tick_at=now - timedelta(minutes=2)
            )
            ticker = Ticker(alias)
            ticker.refresh(now)
            ticker.run_due(now)

    def test_a_schedule_fires_in_database_only(self, settings):
        self._tick_everywhere({"tick": {"every": 60, "job": "tests.record_key"}}, settings)
        assert jobs_on("default").count() == 1
        assert not jobs_on("jobs2").exists()
        assert not Schedule.objects.using("jobs2").filter(declared=True).exists()

    def test_a_schedule_fires_in_the_database_it_names(self, settings):
        self._tick_everywhere(
            {"tick": {"every": 60, "job": "tests.record_key", "database": "jobs2"}}, settings
        )
        assert not jobs_on("default").exists()
        assert jobs_on("jobs2").count() == 1

    def test_a_schedule_for_every_database_fires_in_each(self, settings):
        self._tick_everywhere(
            {"tick": {"every": 60, "job": "tests.record_key", "database": "*"}}, settings
        )
        assert jobs_on("default").count() == 1
        assert jobs_on("jobs2").count() == 1

    def test_a_schedule_naming_another_alias_fails_the_checks(self, settings):
        settings.DJANGO_JOBS = {
            **settings.DJANGO_JOBS,
            "SCHEDULES": {"tick": {"every": 60, "job": "tests.record_key", "database": "other"}},
        }
        found = [m.id for m in run_checks()]
        assert "django_jobs.E213" in found


def test_the_result_names_the_database(two_job_databases):
    assert enqueue(record, {"label": "a"}, using="jobs2").database == "jobs2"
    assert enqueue(record, {"label": "a"}).database == "default"
    again = enqueue(record, {"label": "b"}, key="k", using="jobs2")
    assert enqueue(record, {"label": "b"}, key="k", using="jobs2") == again.__class__(
        again.id, True, "tests.record", "default", None, "jobs2"
    )
    assert [r.database for r in enqueue_many(record, [{"label": "c"}], using="jobs2")] == ["jobs2"]
    with workflow(name="w", using="jobs2") as w:
        w.enqueue(record, {"label": "d"})
    assert [r.database for r in w.results] == ["jobs2"]


class TestHelpers:
    def test_drain_runs_the_jobs_of_every_job_database(self, two_job_databases):
        enqueue(record_where, {"label": "a"}, using="jobs2")
        enqueue(record_where, {"label": "b"})
        drained = testing.drain()
        assert len(drained.succeeded) == 2
        assert list(Audit.objects.using("jobs2").values_list("label", flat=True)) == ["a"]
        assert list(Audit.objects.using("default").values_list("label", flat=True)) == ["b"]

    def test_drain_follows_jobs_that_enqueue_in_the_other_database(self, two_job_databases):
        from django_jobs import job, registry

        @job(name="tests.hop")
        def hop(payload, ctx):
            if payload["left"]:
                there = "jobs2" if ctx.database == "default" else "default"
                enqueue(hop, {"left": payload["left"] - 1}, using=there)

        try:
            enqueue(hop, {"left": 5}, using="jobs2")
            drained = testing.drain()
        finally:
            registry.unregister("tests.hop")
        assert len(drained.succeeded) == 6
        assert not jobs_on("default").exists() and not jobs_on("jobs2").exists()

    def test_drain_using_one_database(self, two_job_databases):
        enqueue(record_where, {"label": "a"}, using="jobs2")
        enqueue(record_where, {"label": "b"})
        assert len(testing.drain(using="default").succeeded) == 1
        assert jobs_on("jobs2").count() == 1
        with pytest.raises(ValueError, match=r"using='other' is not a job database"):
            testing.drain(using="other")

    def test_assertions_see_every_job_database(self, two_job_databases):
        enqueue(record, {"label": "eu"}, using="jobs2")
        testing.assert_enqueued(record, {"label": "eu"})
        with pytest.raises(AssertionError, match=r"tests.record .* on 'jobs2'"):
            testing.assert_not_enqueued(record)


@pytest.mark.parametrize(
    ("jobs_settings", "check_id"),
    [
        ({"DATABASES": ["default", "nowhere"]}, "django_jobs.E018"),
        ({"DATABASES": ["jobs2"], "DATABASE": "default"}, "django_jobs.E018"),
        ({"DATABASES": []}, "django_jobs.E018"),
        ({"DATABASES": "jobs2"}, "django_jobs.E018"),
        ({"DATABASES": 7}, "django_jobs.E018"),
        ({"ROUTE": "tests.nowhere.route"}, "django_jobs.E019"),
        ({"ROUTE": 42}, "django_jobs.E019"),
    ],
)
def test_checks_report_bad_database_settings(settings, jobs_settings, check_id):
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, **jobs_settings}
    assert check_id in [m.id for m in run_checks()]


def test_good_database_settings_pass_the_checks(settings):
    settings.DJANGO_JOBS = {
        **settings.DJANGO_JOBS,
        "DATABASES": ["default", "jobs2"],
        "ROUTE": "tests.test_several_databases.route_everything_to_jobs2",
    }
    found = [m.id for m in run_checks() if m.id.startswith("django_jobs.E")]
    assert not found


def test_the_docs_route_by_customer_spreads_and_keeps_a_customer_together(settings):
    """docs/scaling.md's by_customer, as written there (with "eu" read as "jobs2")."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "scaling.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "by_customer" in b)
    namespace: dict = {}
    exec(block.replace('"eu"', '"jobs2"'), namespace)  # noqa: S102 - the page's own code
    settings.DJANGO_JOBS = {
        **settings.DJANGO_JOBS,
        "DATABASES": ["default", "jobs2"],
        "ROUTE": namespace["by_customer"],
    }
    results = enqueue_many(record, [{"label": "x", "customer": n % 10} for n in range(100)])
    where = {r.id: r.database for r in results}
    assert set(where.values()) == {"default", "jobs2"}
    by_customer = {}
    for n, result in enumerate(results):
        by_customer.setdefault(n % 10, set()).add(result.database)
    assert all(len(places) == 1 for places in by_customer.values())
    assert jobs_on("default").count() + jobs_on("jobs2").count() == 100
    assert enqueue(record, "not a dict").database in ("default", "jobs2")


def test_atomic_requests_on_another_job_database_is_not_warned_about(settings, monkeypatch):
    monkeypatch.setitem(settings.DATABASES["other"], "ATOMIC_REQUESTS", True)
    assert "django_jobs.W022" in [m.id for m in run_checks()]
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "DATABASES": ["default", "other"]}
    assert "django_jobs.W022" not in [m.id for m in run_checks()]


def test_the_checks_look_at_every_job_database(settings, two_job_databases):
    """An unmigrated second job database is warned about by `check --database` (W020)."""
    with connections["jobs2"].cursor() as cursor:
        cursor.execute("DELETE FROM django_migrations WHERE app = 'django_jobs'")
    try:
        found = [m for m in run_checks(databases=["default", "jobs2"]) if m.id.endswith("W020")]
    finally:
        call_command("migrate", "django_jobs", database="jobs2", fake=True, verbosity=0)
    assert len(found) == 1 and "'jobs2'" in found[0].msg


class _RolledBack(Exception):
    pass


@hypothesis.settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)
@hypothesis.given(
    nesting=st.lists(st.sampled_from(["default", "jobs2", "other"]), min_size=1, max_size=5),
    commit=st.booleans(),
)
def test_a_job_enqueued_in_open_job_transactions_never_outlives_their_rollback(
    two_job_databases, nesting, commit
):
    """Whatever blocks are open, the job is written inside one of them, or refused."""
    result = None
    try:
        with contextlib.ExitStack() as blocks:
            for alias in nesting:
                blocks.enter_context(transaction.atomic(using=alias))
            try:
                result = enqueue_on_commit(record, {"label": "x"})
            except InvalidJob:
                assert set(nesting) == {"other"}  # only a block without job tables: refused
                return
            assert result.database in nesting
            assert connections[result.database].in_atomic_block
            assert jobs_on(result.database, id=result.id).exists()
            if not commit:
                raise _RolledBack
    except _RolledBack:
        pass
    assert jobs_on(result.database, id=result.id).exists() == commit
    Job.objects.using(result.database).filter(id=result.id).delete()


def test_a_misspelt_alias_in_databases_is_named_with_the_real_ones(settings):
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "DATABASES": ["default", "ue"]}
    (error,) = [m for m in run_checks() if m.id == "django_jobs.E018"]
    assert "'ue' not in DATABASES" in error.msg
    assert "'jobs2'" in error.hint and "'other'" in error.hint


def test_a_route_that_cannot_be_imported_says_so_at_enqueue(two_job_databases, settings):
    from django.core.exceptions import ImproperlyConfigured

    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "ROUTE": "tests.nowhere.route"}
    with pytest.raises(ImproperlyConfigured, match=r"DJANGO_JOBS\['ROUTE'\] cannot be imported"):
        enqueue(record, {"label": "x"})


def test_the_refusal_names_databases_as_a_way_out(two_job_databases):
    with transaction.atomic(using="other"):
        with pytest.raises(InvalidJob, match=r"if 'other' holds job tables, list it in"):
            enqueue_on_commit(record, {"label": "a"})


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(
    using=st.one_of(
        st.text(max_size=300).filter(lambda t: t not in ("default", "jobs2")),
        st.integers(),
        st.just(10**5000),  # its repr() raises ValueError (int_max_str_digits)
        st.lists(st.just("default"), max_size=2),
        st.binary(max_size=20),
    ),
    via=st.sampled_from(["using", "route"]),
)
def test_an_alias_that_is_no_job_database_is_refused_in_a_short_message(using, via):
    """Any value given as using= or returned by ROUTE that is not a job database: InvalidJob.

    NUL bytes, surrogates, huge strings, non-strings and a list holding an alias are each
    refused before anything is written, in a message of bounded length.
    """
    from django.test import override_settings

    from django_jobs import conf
    from django_jobs.routers import job_database

    jobs = {**conf.get_settings(), "DATABASES": ["default", "jobs2"]}
    if via == "route":
        jobs["ROUTE"] = lambda name, queue, payload: using
    with override_settings(DJANGO_JOBS=jobs), pytest.raises(InvalidJob) as raised:
        job_database(using if via == "using" else None, "n", "default", {})
    assert len(str(raised.value)) < 400
    assert "is not a job database" in str(raised.value)
