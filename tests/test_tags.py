"""Tags and metadata (issue 26): validated, stored, carried to letters, filtered everywhere."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from hypothesis import given
from hypothesis import strategies as st

from django_jobs import control, enqueue, enqueue_many, limits, tagging, workflow
from django_jobs.exceptions import InvalidJob
from django_jobs.models import DeadLetter, Job
from tests.admin_fixtures import url
from tests.conftest import POSTGRES
from tests.testapp import jobs

pytestmark = pytest.mark.django_db


def ids(queryset):
    return set(queryset.values_list("id", flat=True))


# ---- values ---------------------------------------------------------------------------


@given(st.lists(st.text(min_size=1, max_size=64).filter(str.isprintable), max_size=16))
def test_tags_are_kept_sorted_and_distinct(tags):
    assert limits.tags(tags) == sorted(set(tags))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tags": "billing"}, "tags must be a list of strings"),
        ({"tags": [""]}, "a tag must be printable text of 1 to 64"),
        ({"tags": ["x" * 65]}, "a tag must be printable text of 1 to 64"),
        ({"tags": ["line\nbreak"]}, "a tag must be printable"),
        ({"tags": [3]}, "a tag must be printable text"),
        ({"tags": [f"t{n}" for n in range(17)]}, "at most 16 tags"),
        ({"meta": ["a"]}, "meta must be a dict"),
        ({"meta": {"k": 1}}, r"meta\['k'\] must be printable text"),
        ({"meta": {"k": "x" * 201}}, r"meta\['k'\] must be printable text of at most 200"),
        ({"meta": {"": "v"}}, "a meta key must be 1 to 64 letters, digits and _ . : -"),
        ({"meta": {'k"ey': "v"}}, "a meta key must be 1 to 64 letters"),
        ({"meta": {"a=b": "v"}}, "a meta key must be 1 to 64 letters"),
        ({"meta": {5: "v"}}, "a meta key must be 1 to 64 letters"),
        ({"meta": {f"k{n}": "v" for n in range(17)}}, "at most 16 keys"),
    ],
)
def test_bad_tags_and_meta_are_refused_before_any_sql(kwargs, message, django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(InvalidJob, match=message):
        enqueue(jobs.noop, **kwargs)


def test_a_handler_refuses_bad_tags_when_it_is_declared():
    from django_jobs import job

    with pytest.raises(InvalidJob, match="a tag must be printable"):
        job(name="tests.never_registered", tags=[""])(lambda payload, ctx: None)


# ---- storage ----------------------------------------------------------------------


def test_tags_and_meta_are_stored_by_every_way_of_enqueueing():
    plain = enqueue(jobs.noop, tags=["b", "a", "b"], meta={"customer": "42"})
    keyed = enqueue(jobs.noop, key="k1", tags=["a"])
    handler = enqueue(jobs.tagged, tags=["import-7"])
    untagged = enqueue(jobs.noop)
    many = enqueue_many(jobs.noop, [1, 2], tags=["bulk"], meta={"import": "7"})
    with workflow(name="w") as w:
        step = w.enqueue(jobs.noop, tags=["step"], meta={"order": "9"})
        w.enqueue(jobs.tagged, after=[step])
    row = Job.objects.get(id=plain.id)
    assert (row.tags, row.meta) == (["a", "b"], {"customer": "42"})
    assert Job.objects.get(id=keyed.id).tags == ["a"]
    assert Job.objects.get(id=handler.id).tags == ["billing", "import-7"]
    assert (Job.objects.get(id=untagged.id).tags, Job.objects.get(id=untagged.id).meta) == (
        None,
        None,
    )
    for result in many:
        assert (Job.objects.get(id=result.id).tags, Job.objects.get(id=result.id).meta) == (
            ["bulk"],
            {"import": "7"},
        )
    assert Job.objects.get(id=step.id).meta == {"order": "9"}
    assert Job.objects.filter(name="tests.tagged", tags__isnull=False).count() == 2


def test_a_workflows_tags_and_meta_go_on_every_step_besides_the_steps_own():
    with workflow(name="w", tags=["import-7"], meta={"import": "7", "by": "ann"}) as w:
        first = w.enqueue(jobs.noop, tags=["step"], meta={"by": "bob"})
        second = w.enqueue(jobs.tagged, after=[first])
    assert (Job.objects.get(id=first.id).tags, Job.objects.get(id=first.id).meta) == (
        ["import-7", "step"],
        {"by": "bob", "import": "7"},  # the step's own value wins
    )
    assert (Job.objects.get(id=second.id).tags, Job.objects.get(id=second.id).meta) == (
        ["billing", "import-7"],
        {"by": "ann", "import": "7"},
    )


@pytest.mark.parametrize(
    ("workflow_kwargs", "step_kwargs"),
    [
        ({"tags": "import-7"}, {}),
        ({"tags": [f"t{i}" for i in range(17)]}, {}),
        ({"meta": {"bad key": "v"}}, {}),
        ({"tags": ["a"]}, {"tags": "step"}),  # a string is no list, even merged
        ({"tags": [f"w{i}" for i in range(9)]}, {"tags": [f"s{i}" for i in range(8)]}),
        ({"meta": {"a": "1"}}, {"meta": ["not", "a", "dict"]}),
    ],
)
def test_bad_workflow_tags_are_refused_before_any_sql(
    workflow_kwargs, step_kwargs, django_assert_num_queries
):
    with django_assert_num_queries(0), pytest.raises(InvalidJob):  # noqa: PT012
        with workflow(name="w", **workflow_kwargs) as w:
            w.enqueue(jobs.noop, **step_kwargs)


@pytest.mark.django_db(transaction=True)
def test_a_dead_letter_keeps_them_and_a_replay_gives_them_back(run_worker):
    dead = enqueue(jobs.tagged, {"fatal": True}, meta={"customer": "42"})
    run_worker()
    letter = DeadLetter.objects.get(id=dead.id)
    assert (letter.tags, letter.meta) == (["billing"], {"customer": "42"})
    report = control.replay(DeadLetter.objects.filter(id=dead.id), by="tests")
    [(_letter, new_id)] = report.replayed.items()
    job = Job.objects.get(id=new_id)
    assert (job.tags, job.meta) == (["billing"], {"customer": "42"})


# ---- filters ------------------------------------------------------------------------


@pytest.fixture
def labelled():
    return {
        "a": enqueue(jobs.noop, tags=["a"], meta={"customer": "42"}).id,
        "ab": enqueue(jobs.noop, tags=["a", "b"], meta={"customer": "7", "x": "1"}).id,
        "none": enqueue(jobs.noop).id,
        "quote": enqueue(jobs.noop, tags=['it\'s "quoted"'], meta={"k.ey": 'va\'l "q"'}).id,
    }


def test_the_filters_find_exactly_the_labelled_jobs(labelled):
    every = Job.objects.all()
    assert ids(tagging.tagged(every, ["a"])) == {labelled["a"], labelled["ab"]}
    assert ids(tagging.tagged(every, ["a", "b"])) == {labelled["ab"]}
    assert ids(tagging.tagged(every, ["c"])) == set()
    assert ids(tagging.tagged(every, ['it\'s "quoted"'])) == {labelled["quote"]}
    assert ids(tagging.with_meta(every, "customer", "42")) == {labelled["a"]}
    assert ids(tagging.with_meta(every, "customer", "4")) == set()
    assert ids(tagging.with_meta(every, "k.ey", 'va\'l "q"')) == {labelled["quote"]}
    assert ids(tagging.with_meta(every, "x", "1")) == {labelled["ab"]}


def test_the_admin_lists_filter_jobs_and_letters_by_tag_and_meta(labelled, admin_client_):
    page = admin_client_.get(url("job_changelist"), {"tag": "b"})
    assert page.status_code == 200
    assert [job.id for job in page.context["cl"].result_list] == [labelled["ab"]]
    page = admin_client_.get(url("job_changelist"), {"meta": "customer=42"})
    assert [job.id for job in page.context["cl"].result_list] == [labelled["a"]]
    # The handlers' declared tags are offered without reading the table.
    assert "?tag=billing" in admin_client_.get(url("job_changelist")).content.decode()
    # Any other lookup stays refused.
    assert admin_client_.get(url("job_changelist"), {"tags__contains": "a"}).status_code in (
        302,
        400,
    )

    DeadLetter.objects.create(**_letter("l1", ["a"], {"customer": "42"}))
    DeadLetter.objects.create(**_letter("l2", ["z"], None))
    page = admin_client_.get(url("deadletter_changelist"), {"tag": "z"})
    assert [letter.key for letter in page.context["cl"].result_list] == ["l2"]
    page = admin_client_.get(url("deadletter_changelist"), {"meta": "customer=42"})
    assert [letter.key for letter in page.context["cl"].result_list] == ["l1"]


def _letter(key, tags, meta):
    from django.utils import timezone

    from django_jobs.models import uuid7

    now = timezone.now()
    return {
        "id": uuid7(),
        "name": "tests.noop",
        "queue": "default",
        "payload": "null",
        "key": key,
        "attempts": 1,
        "max_attempts": 1,
        "reason": "fatal",
        "enqueued_at": now,
        "dead_at": now,
        "tags": tags,
        "meta": meta,
    }


def test_commands_take_tag(labelled):
    out = StringIO()
    call_command("jobs", "status", "--tag", "a", stdout=out)
    assert "Jobs and dead letters tagged 'a'" in out.getvalue()
    out = StringIO()
    call_command("jobs", "status", "--tag", "a", "--json", stdout=out)
    [row] = json.loads(out.getvalue())["queues"]
    assert (row["queue"], row["waiting"]) == ("default", 2)

    out = StringIO()
    call_command("jobs", "cancel", "--tag", "b", stdout=out)
    assert set(Job.objects.values_list("id", flat=True)) == {
        labelled["a"],
        labelled["none"],
        labelled["quote"],
    }
    assert DeadLetter.objects.get(id=labelled["ab"]).tags == ["a", "b"]  # the letter keeps them
    with pytest.raises(CommandError, match="no live job tagged 'b'"):
        call_command("jobs", "cancel", "--tag", "b")
    with pytest.raises(CommandError, match="--tag TAG alone"):
        call_command("jobs", "cancel", str(labelled["a"]), "--tag", "a")

    out = StringIO()
    call_command("replayjobs", "--tag", "b", stdout=out)
    assert Job.objects.filter(tags__isnull=False).count() == 3  # a, quote and the replayed ab


def test_a_bad_tag_on_the_command_line_is_refused():
    with pytest.raises(CommandError, match="a tag must be printable text of 1 to 64"):
        call_command("jobs", "status", "--tag", "x" * 65)


# ---- the plan on a large table (PostgreSQL) ----------------------------------------


@pytest.mark.postgres
@pytest.mark.slow
def test_the_tag_and_meta_filters_use_their_gin_indexes_on_a_million_jobs():
    with connection.cursor() as cursor:
        # 1,000,000 jobs, one in a thousand tagged, one in ten thousand with meta.
        cursor.execute(
            """
            INSERT INTO django_jobs_job (id, name, queue, payload, priority, run_at, enqueued_at,
                                         attempts, max_attempts, errors, tags, meta)
            SELECT gen_random_uuid(), 'tests.noop', 'default', '{}', 0, now(), now(), 0, 3,
                   '[]',
                   CASE WHEN g % 1000 = 0 THEN jsonb_build_array('t' || (g % 7000)) END,
                   CASE WHEN g % 10000 = 0 THEN jsonb_build_object('customer', (g % 70000)::text)
                   END
            FROM generate_series(1, 1000000) AS g
            """
        )
        cursor.execute("ANALYZE django_jobs_job")
    for queryset, index in (
        (tagging.tagged(Job.objects.all(), ["t3000"]), "django_jobs_job_tags"),
        (tagging.with_meta(Job.objects.all(), "customer", "30000"), "django_jobs_job_meta"),
    ):
        plan = queryset.explain()
        assert f"Bitmap Index Scan on {index}" in plan, plan
        assert "Seq Scan" not in plan, plan
        assert queryset.count() == (143 if index.endswith("tags") else 14)


@pytest.mark.skipif(POSTGRES, reason="the JSON functions of SQLite and MariaDB")
def test_elsewhere_the_filters_use_the_engines_json_functions(labelled):
    sql = str(tagging.tagged(Job.objects.all(), ["a"]).query).lower()
    assert ("json_each" in sql) if connection.vendor == "sqlite" else ("json_contains" in sql)
