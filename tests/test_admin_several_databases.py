"""The admin and the dashboard with several job databases (DJANGO_JOBS["DATABASES"]).

Every list of job tables has a "database" filter; a row's page, its actions and its
links act on the database the row came from. "jobs2" is a second PostgreSQL server on
PostgreSQL runs, a second file on SQLite.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.utils import timezone

from django_jobs import enqueue, workflow
from django_jobs.models import (
    CompletionMarker,
    DeadLetter,
    DeadReason,
    Job,
    QueueState,
    Schedule,
    WorkerBeat,
    WorkflowStep,
)
from tests.admin_fixtures import messages_of, url
from tests.factories import DeadLetterFactory, MarkerFactory, WorkerBeatFactory
from tests.testapp.jobs import record

pytestmark = pytest.mark.django_db(databases=["default", "jobs2"], transaction=True)

# Every change list of job tables the admin registers, and a row of its table.
LISTS = [
    "job",
    "runningjob",
    "deadletter",
    "completionmarker",
    "queuestate",
    "schedule",
    "workerbeat",
]


def on(alias, factory, **fields):
    """A factory's row written on job database alias (factories write on the default)."""
    row = factory.build(**fields)
    row.save(using=alias, force_insert=True)
    return row


def shown(response):
    return [row.pk for row in response.context["cl"].result_list]


def filter_titles(response):
    return [str(spec.title) for spec in response.context["cl"].filter_specs]


def jobs2(path):
    return f"{path}{'&' if '?' in path else '?'}database=jobs2"


class TestLists:
    def test_the_job_list_shows_the_chosen_database(self, two_job_databases, admin_client_):
        here = enqueue(record, {"label": "here"}).id
        there = enqueue(record, {"label": "there"}, using="jobs2").id

        default = admin_client_.get(url("job_changelist"))
        chosen = admin_client_.get(jobs2(url("job_changelist")))

        assert shown(default) == [here]
        assert shown(chosen) == [there]
        assert filter_titles(default)[0] == "database"
        text = default.content.decode()
        assert "?database=jobs2" in text and "?database=default" in text
        spec = chosen.context["cl"].filter_specs[0]
        choices = list(spec.choices(chosen.context["cl"]))
        assert [(c["display"], c["selected"]) for c in choices] == [
            ("default", False),
            ("jobs2", True),
        ]

    def test_the_filter_keeps_the_other_filters(self, two_job_databases, admin_client_):
        enqueue(record, {"label": "a"}, using="jobs2", queue="other")
        wanted = enqueue(record, {"label": "b"}, using="jobs2", queue="default").id
        enqueue(record, {"label": "c"}, queue="default")

        response = admin_client_.get(jobs2(url("job_changelist") + "?queue=default"))

        assert shown(response) == [wanted]

    @pytest.mark.parametrize("model", LISTS)
    def test_every_list_has_the_filter(self, two_job_databases, admin_client_, model):
        response = admin_client_.get(jobs2(url(f"{model}_changelist")))

        assert response.status_code == 200
        assert "database" in filter_titles(response)
        assert response.context["cl"].queryset.db == "jobs2"

    def test_each_list_reads_its_rows_there(self, two_job_databases, admin_client_):
        letter = on("jobs2", DeadLetterFactory)
        marker = on("jobs2", MarkerFactory)
        beat = on("jobs2", WorkerBeatFactory)
        QueueState.objects.using("jobs2").create(name="only-there")

        assert shown(admin_client_.get(jobs2(url("deadletter_changelist")))) == [letter.pk]
        assert shown(admin_client_.get(jobs2(url("completionmarker_changelist")))) == [marker.pk]
        assert shown(admin_client_.get(jobs2(url("workerbeat_changelist")))) == [beat.pk]
        queues = admin_client_.get(jobs2(url("queuestate_changelist")))
        assert "only-there" in shown(queues)
        assert not shown(admin_client_.get(url("deadletter_changelist")))
        assert "only-there" not in shown(admin_client_.get(url("queuestate_changelist")))

    def test_an_alias_that_is_no_job_database_is_refused(self, two_job_databases, admin_client_):
        response = admin_client_.get(url("job_changelist") + "?database=other")

        assert response.status_code == 302
        assert response["Location"].endswith("?e=1")

    @pytest.mark.parametrize("model", LISTS)
    def test_with_one_database_there_is_no_filter(self, admin_client_, model):
        response = admin_client_.get(url(f"{model}_changelist"))

        assert response.status_code == 200
        assert "database" not in filter_titles(response)
        assert "database=" not in response.content.decode()
        # Nor is the parameter taken: the list filters by its declared filters only.
        assert admin_client_.get(jobs2(url(f"{model}_changelist"))).status_code == 400


class TestPages:
    def test_a_row_page_of_jobs2_opens(self, two_job_databases, admin_client_):
        job = enqueue(record, {"label": "there"}, using="jobs2").id

        page = admin_client_.get(jobs2(url("job_change", job)))
        # From the list: Django keeps the list's query string in _changelist_filters.
        listed = admin_client_.get(url("job_change", job) + "?_changelist_filters=database%3Djobs2")
        elsewhere = admin_client_.get(url("job_change", job), follow=True)

        assert page.status_code == 200 and page.context["original"].pk == job
        assert page.context["original"]._state.db == "jobs2"
        assert listed.status_code == 200 and listed.context["original"].pk == job
        assert "doesn’t exist" in messages_of(elsewhere)[0]  # not on the default database
        # The list's link to the row keeps the database; the page's crumbs lead back to it.
        text = admin_client_.get(jobs2(url("job_changelist"))).content.decode()
        assert f"{url('job_change', job)}?_changelist_filters=database%3Djobs2" in text
        assert "_changelist_filters=database%3Djobs2" in page.content.decode()

    def test_a_letter_page_links_its_replayed_job_there(self, two_job_databases, admin_client_):
        new = enqueue(record, {"label": "again"}, using="jobs2").id
        letter = on("jobs2", DeadLetterFactory, replayed_at=timezone.now(), replay_job_id=new)

        text = admin_client_.get(jobs2(url("deadletter_change", letter.pk))).content.decode()

        assert f'href="{url("job_change", new)}?database=jobs2"' in text
        assert "is live." in text

    def test_a_marker_page_links_its_letter_there(self, two_job_databases, admin_client_):
        marker = on("jobs2", MarkerFactory)
        letter = on("jobs2", DeadLetterFactory, replay_job_id=marker.job_id)

        text = admin_client_.get(jobs2(url("completionmarker_change", marker.pk))).content
        assert f'href="{url("deadletter_change", letter.pk)}?database=jobs2"' in text.decode()


class TestActions:
    def test_replay_of_a_jobs2_letter_writes_its_job_there(self, two_job_databases, admin_client_):
        letter = on("jobs2", DeadLetterFactory)
        data = {"action": "replay_selected", "_selected_action": [str(letter.pk)], "post": "yes"}

        response = admin_client_.post(jobs2(url("deadletter_changelist")), data, follow=True)

        assert messages_of(response) == ["1 replayed."]
        [job] = Job.objects.using("jobs2").all()
        assert DeadLetter.objects.using("jobs2").get().replay_job_id == job.id
        assert not Job.objects.using("default").exists()
        assert LogEntry.objects.filter(object_id=str(letter.pk)).count() == 1

    def test_the_replay_confirmation_counts_the_letters_there(
        self, two_job_databases, admin_client_
    ):
        letter = on("jobs2", DeadLetterFactory)
        data = {"action": "replay_selected", "_selected_action": [str(letter.pk)]}

        response = admin_client_.post(jobs2(url("deadletter_changelist")), data)

        assert response.context["replayable"] == 1
        assert not Job.objects.using("jobs2").exists()

    def test_the_replay_button_of_a_jobs2_letter(self, two_job_databases, admin_client_):
        letter = on("jobs2", DeadLetterFactory)
        page = admin_client_.get(jobs2(url("deadletter_change", letter.pk)))
        replay = jobs2(url("deadletter_replay", letter.pk))
        assert page.context["replay_url"] == replay

        response = admin_client_.post(replay, follow=True)

        assert response.redirect_chain[-1][0] == jobs2(url("deadletter_change", letter.pk))
        assert messages_of(response) == ["1 replayed."]
        [job] = Job.objects.using("jobs2").all()
        assert DeadLetter.objects.using("jobs2").get().replay_job_id == job.id
        assert not Job.objects.using("default").exists()
        assert f'href="{url("job_change", job.id)}?database=jobs2"' in response.content.decode()

    def test_a_letter_whose_key_is_done_there_is_not_replayable(
        self, two_job_databases, admin_client_
    ):
        letter = on("jobs2", DeadLetterFactory, key="k1")
        on("jobs2", MarkerFactory, key="k1")

        page = admin_client_.get(jobs2(url("deadletter_change", letter.pk)))

        assert "has completed since" in str(page.context["replay_blocked"])

    def test_cancel_of_a_jobs2_job(self, two_job_databases, admin_client_):
        there = enqueue(record, {"label": "there"}, using="jobs2").id
        here = enqueue(record, {"label": "here"}).id
        data = {"action": "cancel", "_selected_action": [str(there)]}

        response = admin_client_.post(jobs2(url("job_changelist")), data, follow=True)

        assert messages_of(response)[0].startswith("1 cancelled")
        assert not Job.objects.using("jobs2").exists()
        letter = DeadLetter.objects.using("jobs2").get()
        assert (letter.pk, letter.reason) == (there, DeadReason.CANCELLED)
        assert list(Job.objects.using("default").values_list("id", flat=True)) == [here]

    def test_the_running_list_flags_a_jobs2_job(self, two_job_databases, admin_client_):
        there = enqueue(record, {"label": "there"}, using="jobs2").id
        Job.objects.using("jobs2").filter(id=there).update(
            locked_by="w1", lease_expires_at=timezone.now() + timedelta(hours=1), attempts=1
        )
        data = {"action": "cancel_jobs", "_selected_action": [str(there)]}

        response = admin_client_.post(jobs2(url("runningjob_changelist")), data, follow=True)

        assert "asked the workers of 1 running job" in messages_of(response)[0]
        assert Job.objects.using("jobs2").get().cancel_requested_at is not None

    def test_run_now_of_a_jobs2_job(self, two_job_databases, admin_client_):
        later = enqueue(record, {"label": "later"}, using="jobs2", delay=3600).id
        data = {"action": "run_now", "_selected_action": [str(later)]}

        response = admin_client_.post(jobs2(url("job_changelist")), data, follow=True)

        assert messages_of(response) == ["1 made due now."]
        assert Job.objects.using("jobs2").waiting().filter(id=later).exists()

    def test_pause_and_resume_of_a_jobs2_queue(self, two_job_databases, admin_client_):
        for alias in ("jobs2", "default"):
            QueueState.objects.using(alias).get_or_create(name="default")  # a declared queue
        changelist = jobs2(url("queuestate_changelist"))
        selected = {"_selected_action": ["default"]}

        admin_client_.post(changelist, {"action": "pause_queues", **selected})

        assert QueueState.objects.using("jobs2").get(name="default").paused
        assert not QueueState.objects.using("default").get(name="default").paused
        QueueState.objects.using("default").filter(name="default").update(paused=True)
        admin_client_.post(changelist, {"action": "resume_queues", **selected})
        assert not QueueState.objects.using("jobs2").get(name="default").paused
        assert QueueState.objects.using("default").get(name="default").paused

    def test_delete_of_a_jobs2_letter(self, two_job_databases, admin_client_):
        letter = on("jobs2", DeadLetterFactory)
        kept = DeadLetterFactory(id=letter.pk)  # the same id on the default database

        response = admin_client_.post(jobs2(url("deadletter_delete", letter.pk)), {"post": "yes"})

        assert response.status_code == 302
        assert not DeadLetter.objects.using("jobs2").exists()
        assert list(DeadLetter.objects.using("default").values_list("pk", flat=True)) == [kept.pk]

    def test_the_delete_action_on_jobs2_letters(self, two_job_databases, admin_client_):
        letter = on("jobs2", DeadLetterFactory)
        kept = DeadLetterFactory(id=letter.pk)
        data = {"action": "delete_selected", "_selected_action": [str(letter.pk)]}
        changelist = jobs2(url("deadletter_changelist"))

        asked = admin_client_.post(changelist, data)
        assert asked.status_code == 200 and not asked.context["protected"]
        admin_client_.post(changelist, {**data, "post": "yes"})

        assert not DeadLetter.objects.using("jobs2").exists()
        assert list(DeadLetter.objects.using("default").values_list("pk", flat=True)) == [kept.pk]


class TestLinksKeepTheDatabase:
    """The links that lead back to a list or a row keep its database (not the default's)."""

    def test_show_all_of_a_search_lists_that_database(self, two_job_databases, admin_client_):
        enqueue(record, {"label": "a"}, using="jobs2", key="needle")
        enqueue(record, {"label": "b"}, using="jobs2", key="hay")

        response = admin_client_.get(jobs2(url("job_changelist")) + "&q=needle")

        assert len(shown(response)) == 1
        assert '(<a href="?database=jobs2">' in response.content.decode()
        # The default database's list keeps Django's link.
        default = admin_client_.get(url("job_changelist") + "?q=needle")
        assert '(<a href="?">' in default.content.decode()

    def test_clear_all_filters_keeps_the_database(self, two_job_databases, admin_client_):
        filtered = admin_client_.get(jobs2(url("job_changelist") + "?queue=default"))
        alone = admin_client_.get(jobs2(url("job_changelist")))

        assert filtered.context["cl"].clear_all_filters_qs == "?database=jobs2"
        assert 'href="?database=jobs2">&#10006; Clear all filters' in filtered.content.decode()
        # The database alone is no filter to clear: no link that would lead to the same page.
        assert "Clear all filters" not in alone.content.decode()
        default = admin_client_.get(url("job_changelist") + "?queue=default")
        assert default.context["cl"].clear_all_filters_qs == "?"

    @pytest.mark.parametrize("opened", ["direct", "from_list"])
    def test_the_crumbs_of_a_row_lead_to_its_list(self, two_job_databases, admin_client_, opened):
        job = enqueue(record, {"label": "there"}, using="jobs2").id
        letter = on("jobs2", DeadLetterFactory)
        query = "?database=jobs2" if opened == "direct" else "?_changelist_filters=database%3Djobs2"
        back = '<a href="/admin/django_jobs/{}/?database=jobs2">'

        for page, model in [
            (url("job_change", job), "job"),
            (url("deadletter_change", letter.pk), "deadletter"),
            (url("deadletter_delete", letter.pk), "deadletter"),
            (url("deadletter_history", letter.pk), "deadletter"),
        ]:
            response = admin_client_.get(page + query)
            assert response.status_code == 200, page
            crumbs = response.content.decode().split('class="breadcrumbs"')[1].split("</ol>")[0]
            assert back.format(model) in crumbs, (page, crumbs)
            if "/change/" not in page:  # delete and history: the crumb to the row too
                row = f'<a href="{url("deadletter_change", letter.pk)}?database=jobs2">'
                assert row in crumbs, (page, crumbs)

    def test_deleting_a_letter_goes_back_to_its_list(self, two_job_databases, admin_client_):
        letter = on("jobs2", DeadLetterFactory)

        response = admin_client_.post(jobs2(url("deadletter_delete", letter.pk)), {"post": "yes"})

        assert response.status_code == 302
        assert response["Location"] == jobs2(url("deadletter_changelist"))
        assert not DeadLetter.objects.using("jobs2").exists()

    def test_a_row_page_says_its_database(self, two_job_databases, admin_client_):
        job = enqueue(record, {"label": "there"}, using="jobs2").id
        letter = on("jobs2", DeadLetterFactory)
        here = enqueue(record, {"label": "here"}).id
        line = '<p class="django-jobs-row-database" id="django-jobs-row-database">Database: {}</p>'

        for page, alias in [
            (jobs2(url("job_change", job)), "jobs2"),
            (jobs2(url("deadletter_change", letter.pk)), "jobs2"),
            (url("job_change", here), "default"),
        ]:
            assert line.format(alias) in admin_client_.get(page).content.decode(), page

    def test_one_database_says_none(self, admin_client_):
        job = enqueue(record, {"label": "here"}).id
        text = admin_client_.get(url("job_change", job)).content.decode()
        assert "django-jobs-row-database" not in text
        crumbs = text.split('class="breadcrumbs"')[1].split("</ol>")[0]
        assert '<a href="/admin/django_jobs/job/">' in crumbs


class TestWorkflows:
    def make(self, alias):
        with workflow(name=f"flow on {alias}", using=alias) as flow:
            first = flow.enqueue(record, {"label": "first"})
            flow.enqueue(record, {"label": "second"}, after=[first])
        return flow

    def test_the_list_and_the_page_of_a_jobs2_workflow(self, two_job_databases, admin_client_):
        self.make("jobs2")
        self.make("default")

        listed = admin_client_.get(jobs2(url("workflowstep_changelist")))
        default = admin_client_.get(url("workflowstep_changelist"))

        assert [row["steps"] for row in listed.context["rows"]] == [2]
        assert "flow on jobs2" in str(listed.context["rows"][0]["name"])
        assert "flow on default" in str(default.context["rows"][0]["name"])
        assert listed.context["rows"][0]["url"].endswith("&database=jobs2")
        assert [(a, current) for a, _link, current in listed.context["databases"]] == [
            ("default", False),
            ("jobs2", True),
        ]
        page = admin_client_.get(listed.context["rows"][0]["url"])
        assert page.status_code == 200 and page.context["total"] == 2
        assert page.context["database"] == "jobs2"
        urls = [step["url"] for step in page.context["steps"]]
        assert urls and all(u.endswith("?database=jobs2") for u in urls)
        assert all(admin_client_.get(u).status_code == 200 for u in urls)
        # The list without the parameter does not know it.
        name = "flow on jobs2"
        assert admin_client_.get(url("workflow") + f"?name={name}").status_code == 404

    def test_a_jobs2_job_page_links_its_workflow_there(self, two_job_databases, admin_client_):
        flow = self.make("jobs2")
        first = flow.results[0].id

        text = admin_client_.get(jobs2(url("job_change", first))).content.decode()

        assert "django-jobs-workflow-link" in text
        assert (
            "database=jobs2" in text.split('id="django-jobs-workflow-link"')[0].rsplit("<a ", 1)[1]
        )

    def test_cancel_of_a_jobs2_workflow(self, two_job_databases, admin_client_):
        self.make("jobs2")
        self.make("default")
        cancel = jobs2(url("workflow_cancel"))

        response = admin_client_.post(cancel, {"name": "flow on jobs2"}, follow=True)

        assert response.redirect_chain[-1][0].endswith("database=jobs2")
        assert "2 step(s) cancelled" in messages_of(response)[0]
        assert not Job.objects.using("jobs2").exists()
        assert DeadLetter.objects.using("jobs2").count() == 2
        assert Job.objects.using("default").count() == 2
        assert WorkflowStep.objects.using("jobs2").count() == 2


class TestDashboard:
    def test_a_section_per_database(self, two_job_databases, admin_client_):
        enqueue(record, {"label": "a"}, using="jobs2")
        enqueue(record, {"label": "b"}, using="jobs2")
        enqueue(record, {"label": "c"})
        on("jobs2", DeadLetterFactory)

        response = admin_client_.get(url("dashboard"))

        sections = response.context["sections"]
        assert [s["alias"] for s in sections] == ["default", "jobs2"]
        waiting = {s["alias"]: {r.queue: r.waiting for r in s["snap"].queues} for s in sections}
        assert waiting["default"]["default"] == 1 and waiting["jobs2"]["default"] == 2
        assert [s["snap"].dead_by_reason for s in sections][1][0][2] == 1
        text = response.content.decode()
        assert 'id="django-jobs-database-jobs2"' in text and 'id="django-jobs-queues-jobs2"' in text
        assert "Job database jobs2" in text and "Job database default" in text
        assert f"{url('job_changelist')}?database=jobs2&amp;queue=default" in text
        assert f"{url('job_changelist')}?queue=default" in text  # the default's
        assert f"{url('workerbeat_changelist')}?database=jobs2" in text

    def test_one_database_has_no_section_heading(self, admin_client_):
        enqueue(record, {"label": "c"})

        text = admin_client_.get(url("dashboard")).content.decode()

        assert "Job database" not in text and "database=" not in text
        assert 'id="django-jobs-queues"' in text


def test_models_list_is_complete():
    """LISTS names every change list of a job table the admin registers."""
    registered = {
        model._meta.model_name
        for model in admin.site._registry
        if model._meta.app_label == "django_jobs"
    }
    assert registered - {"workflowstep"} == set(LISTS)
    assert {CompletionMarker, DeadLetter, Job, QueueState, Schedule, WorkerBeat} <= set(
        admin.site._registry
    )
