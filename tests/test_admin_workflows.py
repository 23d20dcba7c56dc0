"""The workflow pages of the admin, on real rows: states, links, the graph, permissions, escaping.

The rows are written directly (jobs with waiting_for > 0 and the BLOCKED_UNTIL run-at,
Dependency and WorkflowStep rows, markers and dead letters for finished and dead steps),
as enqueue and settle would leave them.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from datetime import timedelta
from html import unescape

import pytest
from django.utils import timezone

from django_jobs import control
from django_jobs.admin import graph
from django_jobs.admin.workflows import GRAPH_LIMIT, layer_ranges
from django_jobs.models import (
    BLOCKED_UNTIL,
    DeadLetter,
    DeadReason,
    Dependency,
    Job,
    OnParentDead,
    WorkflowStep,
)
from django_jobs.rows import uuid7
from tests.admin_fixtures import messages_of, url
from tests.factories import DeadLetterFactory, JobFactory, MarkerFactory

pytestmark = pytest.mark.django_db


def workflow_page(client, name, **params):
    return client.get(url("workflow"), {"name": name, **params})


def step(workflow, job_id, name, *, key=None, at=None):
    return WorkflowStep.objects.create(
        job_id=job_id, workflow=workflow, name=name, key=key, created_at=at or timezone.now()
    )


def edge(job_id, parent_id, *, key=None, satisfied=False, on_parent_dead=OnParentDead.WAIT):
    return Dependency.objects.create(
        job_id=job_id,
        parent_key=key or str(parent_id),
        parent_id=parent_id,
        on_parent_dead=on_parent_dead,
        created_at=timezone.now(),
        satisfied_at=timezone.now() if satisfied else None,
    )


def blocked_job(**fields):
    return JobFactory(run_at=BLOCKED_UNTIL, **fields)


@pytest.fixture
def diamond():
    """charge (done) -> reserve (running), confirm (dead) -> ship (blocked on both)."""
    name = "order-42"
    t0 = timezone.now() - timedelta(minutes=5)
    charge = MarkerFactory(name="shop.jobs.charge", key="charge-42")
    reserve = JobFactory(name="shop.jobs.reserve", leased=True)
    confirm = DeadLetterFactory(name="shop.jobs.confirm", reason=DeadReason.FATAL)
    ship = blocked_job(name="shop.jobs.ship", waiting_for=2)
    step(name, charge.job_id, "shop.jobs.charge", key="charge-42", at=t0)
    step(name, reserve.id, "shop.jobs.reserve", at=t0 + timedelta(seconds=1))
    step(name, confirm.id, "shop.jobs.confirm", at=t0 + timedelta(seconds=2))
    step(name, ship.id, "shop.jobs.ship", at=t0 + timedelta(seconds=3))
    edge(reserve.id, charge.job_id, key="charge-42", satisfied=True)
    edge(confirm.id, charge.job_id, key="charge-42", satisfied=True)
    edge(ship.id, reserve.id)
    edge(ship.id, confirm.id)
    return {
        "name": name,
        "charge": charge.job_id,
        "reserve": reserve.id,
        "confirm": confirm.id,
        "ship": ship.id,
    }


# -- the list


def test_the_list_counts_each_workflows_steps_by_state(admin_client_, diamond):
    other = JobFactory(name="tests.noop")
    step("nightly-report", other.id, "tests.noop")
    response = admin_client_.get(url("workflowstep_changelist"))
    assert response.status_code == 200
    rows = {unescape(re.sub(r"<[^>]+>", "", r["name"])): r for r in response.context["rows"]}
    order = rows["order-42"]
    assert (order["steps"], order["done"], order["running"], order["blocked"], order["dead"]) == (
        4,
        1,
        1,
        1,
        1,
    )
    assert order["waiting"] == 0
    assert rows["nightly-report"]["waiting"] == 1 and rows["nightly-report"]["steps"] == 1
    # Newest first, and each name links its page.
    assert list(rows) == ["nightly-report", "order-42"]
    assert 'href="/admin/django_jobs/workflowstep/workflow/?name=order-42"' in response.text


def test_the_list_searches_names_and_pages(admin_client_, diamond):
    t0 = timezone.now() - timedelta(days=1)
    for i in range(60):
        step(f"import-{i:03}", uuid7(), "tests.noop", at=t0 + timedelta(seconds=i))
    found = admin_client_.get(url("workflowstep_changelist"), {"q": "rder-4"})
    assert [r["steps"] for r in found.context["rows"]] == [4]
    first = admin_client_.get(url("workflowstep_changelist"))
    assert len(first.context["rows"]) == 50 and first.context["page"].paginator.count == 61
    assert "?p=2" in first.text
    second = admin_client_.get(url("workflowstep_changelist"), {"p": 2})
    assert len(second.context["rows"]) == 11
    # Steps with no row left anywhere are counted as gone, not as waiting.
    assert second.context["rows"][-1]["gone"] == 1


def test_the_list_counts_states_in_a_bounded_number_of_queries(
    admin_client_, diamond, django_assert_max_num_queries
):
    for i in range(30):
        job = blocked_job(waiting_for=1)
        step(f"batch-{i}", job.id, "tests.noop")
    with django_assert_max_num_queries(12):
        response = admin_client_.get(url("workflowstep_changelist"))
    assert sum(r["blocked"] for r in response.context["rows"]) == 31


# -- one workflow


def test_the_diamond_is_drawn_with_its_states_and_links(admin_client_, diamond):
    response = workflow_page(admin_client_, "order-42")
    assert response.status_code == 200
    page = response.text
    svg = re.search(r'<svg [^>]*class="django-jobs-graph".*?</svg>', page, re.S).group()
    nodes = re.findall(r'<a class="django-jobs-node" href="([^"]+)" data-state="(\w+)">', svg)
    assert sorted(nodes) == sorted(
        [
            (f"/admin/django_jobs/completionmarker/{diamond['charge']}/change/", "done"),
            (f"/admin/django_jobs/job/{diamond['reserve']}/change/", "running"),
            (f"/admin/django_jobs/deadletter/{diamond['confirm']}/change/", "dead"),
            (f"/admin/django_jobs/job/{diamond['ship']}/change/", "blocked"),
        ]
    )
    assert svg.count('class="django-jobs-edge"') == 4
    # Layers left to right: charge, then reserve and confirm in one column, then ship.
    x = {}
    for href, body in re.findall(r'<a class="django-jobs-node" href="([^"]+)"[^>]*>(.*?)</a>', svg):
        x[href.split("/")[-3]] = float(re.search(r'<rect x="([\d.]+)"', body).group(1))
    assert x[str(diamond["charge"])] < x[str(diamond["reserve"])] == x[str(diamond["confirm"])]
    assert x[str(diamond["confirm"])] < x[str(diamond["ship"])]
    # The legend counts every state, with the colour the graph uses.
    legend = {state: count for state, _label, _color, count in response.context["legend"]}
    assert legend == {
        "blocked": 1,
        "scheduled": 0,
        "waiting": 0,
        "running": 1,
        "done": 1,
        "dead": 1,
        "gone": 0,
    }
    assert graph.COLORS["dead"][0] in page
    # The table says what the blocked step waits for: both parents, not yet satisfied.
    ship = next(s for s in response.context["steps"] if s["job_id"] == diamond["ship"])
    assert ship["layer"] == 3 and ship["state"] == "blocked"
    parents = str(ship["parents"])
    assert parents.count("not satisfied yet") == 2
    assert parents.count("replay the parent to release it") == 1  # confirm died
    assert f"/admin/django_jobs/job/{diamond['reserve']}/change/" in parents
    assert f"/admin/django_jobs/deadletter/{diamond['confirm']}/change/" in parents


def test_a_replayed_step_is_followed_to_its_replay(admin_client_):
    first = DeadLetterFactory(name="tests.flaky")
    again = uuid7()
    DeadLetter.objects.filter(id=first.id).update(replayed_at=timezone.now(), replay_job_id=again)
    MarkerFactory(job_id=again, name="tests.flaky")
    step("replayed", first.id, "tests.flaky")
    response = workflow_page(admin_client_, "replayed")
    (row,) = response.context["steps"]
    assert row["state"] == "done" and row["current"] == again
    assert f"/admin/django_jobs/completionmarker/{again}/change/" in response.text
    listed = admin_client_.get(url("workflowstep_changelist")).context["rows"]
    assert listed[0]["done"] == 1 and listed[0]["dead"] == 0


def test_a_big_workflow_gets_layer_counts_and_a_paginated_table(admin_client_):
    t0 = timezone.now() - timedelta(hours=1)
    ids = [uuid7() for _ in range(GRAPH_LIMIT + 1)]
    Job.objects.bulk_create(
        [
            Job(
                id=job_id,
                name="tests.noop",
                queue="default",
                payload="{}",
                run_at=BLOCKED_UNTIL if i else t0,
                enqueued_at=t0,
                waiting_for=1 if i else 0,
                max_attempts=1,
            )
            for i, job_id in enumerate(ids)
        ]
    )
    WorkflowStep.objects.bulk_create(
        [
            WorkflowStep(
                job_id=job_id,
                workflow="chain",
                name="tests.noop",
                created_at=t0 + timedelta(milliseconds=i),
            )
            for i, job_id in enumerate(ids)
        ]
    )
    # A chain of all but the last step, which is a second root.
    Dependency.objects.bulk_create(
        [
            Dependency(job_id=child, parent_key=str(parent), parent_id=parent, created_at=t0)
            for parent, child in zip(ids, ids[1:-1], strict=False)
        ]
    )
    response = workflow_page(admin_client_, "chain")
    assert response.status_code == 200
    assert "svg" not in response.context and "django-jobs-graph" not in response.text
    # Layer 1 holds the two roots, each layer after it one step of the chain.
    assert response.context["layers"] == [("1", 2), (f"2–{GRAPH_LIMIT}", 1)]
    assert "1 each" in response.text
    assert len(response.context["steps"]) == 100
    last = workflow_page(admin_client_, "chain", p=4)
    assert len(last.context["steps"]) == GRAPH_LIMIT + 1 - 300
    # By layer: both roots open the first page, the chain's end closes the last.
    assert [s["layer"] for s in response.context["steps"][:3]] == [1, 1, 2]
    assert [s["layer"] for s in last.context["steps"]] == [GRAPH_LIMIT]


def test_unknown_and_nul_names(admin_client_):
    assert workflow_page(admin_client_, "no-such-workflow").status_code == 404
    assert workflow_page(admin_client_, "bad\x00name").status_code == 400
    assert admin_client_.get(url("workflowstep_changelist"), {"q": "a\x00"}).status_code == 400
    assert admin_client_.get(url("workflow")).status_code == 302  # no name: the list


def test_a_step_page_leads_to_its_workflow(admin_client_, diamond):
    response = admin_client_.get(url("workflowstep_change", diamond["ship"]))
    assert response.status_code == 302
    assert response["Location"] == "/admin/django_jobs/workflowstep/workflow/?name=order-42"


# -- the job and dead-letter pages


def test_a_blocked_jobs_page_lists_its_parents_and_links_its_workflow(admin_client_, diamond):
    response = admin_client_.get(url("job_change", diamond["ship"]))
    assert response.status_code == 200
    page = response.text
    assert "Blocked (waiting for 2 parent(s))" in page or "blocked (waiting for 2" in page.lower()
    assert 'id="django-jobs-workflow-link"' in page and "?name=order-42" in page
    parents = re.search(r'<ul class="django-jobs-parents">.*?</ul>', page, re.S).group()
    assert str(diamond["reserve"]) in parents and str(diamond["confirm"]) in parents
    assert f"/admin/django_jobs/job/{diamond['reserve']}/change/" in parents
    assert f"/admin/django_jobs/deadletter/{diamond['confirm']}/change/" in parents
    # A step whose parent finished shows it as satisfied, linked to the marker.
    reserve = admin_client_.get(url("job_change", diamond["reserve"])).text
    # The parent is a step of the same workflow: named by its step name, then its key.
    assert "✓ satisfied" in reserve
    assert (
        '<li><code>shop.<wbr>jobs.<wbr>charge</code> <span class="django-jobs-quiet">'
        "(key <code>charge-<wbr>42</code>)</span>: "
    ) in reserve
    assert f"/admin/django_jobs/completionmarker/{diamond['charge']}/change/" in reserve


def test_a_blocked_jobs_own_delay_or_run_at_shows_with_its_run_at(admin_client_):
    delayed = blocked_job(waiting_for=1, release_delay=timedelta(hours=2))
    at = timezone.now() + timedelta(days=1)
    timed = blocked_job(waiting_for=1, not_before=at)
    page = admin_client_.get(url("job_change", delayed.id)).text
    assert "2h after its parents" in page
    listed = admin_client_.get(url("job_changelist"), {"state": "blocked"}).text
    assert "2h after its parents" in listed
    assert f"after its parents, not before {timezone.localtime(at):%Y-%m-%d %H:%M:%S}" in listed
    assert "after its parents, not before" in admin_client_.get(url("job_change", timed.id)).text


def test_a_job_after_many_parents_lists_the_first_hundred(admin_client_):
    child = blocked_job(waiting_for=150)
    now = timezone.now()
    Dependency.objects.bulk_create(
        [
            Dependency(
                job_id=child.id,
                parent_key=f"parent-{i:03}",
                parent_id=uuid7(),
                created_at=now + timedelta(milliseconds=i),
            )
            for i in range(150)
        ]
    )
    page = admin_client_.get(url("job_change", child.id)).text
    parents = re.search(r'<ul class="django-jobs-parents">.*?</ul>', page, re.S).group()
    assert parents.count("<li><code>") == 100 and "and 50 more" in parents
    assert "parent-<wbr>000" in parents and "parent-<wbr>100" not in parents


def test_a_job_outside_workflows_has_no_workflow_section(admin_client_):
    job = JobFactory()
    assert "django-jobs-workflow-link" not in admin_client_.get(url("job_change", job.id)).text


def test_the_state_filter_has_blocked(admin_client_, diamond):
    scheduled = JobFactory(run_at=timezone.now() + timedelta(hours=1))
    blocked = admin_client_.get(url("job_changelist"), {"state": "blocked"})
    assert [row.pk for row in blocked.context["cl"].result_list] == [diamond["ship"]]
    assert "after its parents" in blocked.text
    later = admin_client_.get(url("job_changelist"), {"state": "scheduled"})
    assert [row.pk for row in later.context["cl"].result_list] == [scheduled.id]


def test_a_parent_dead_letter_shows_the_parent(admin_client_):
    parent = DeadLetterFactory(name="shop.jobs.charge", reason=DeadReason.FATAL)
    child = DeadLetterFactory(name="shop.jobs.ship", reason=DeadReason.PARENT_DEAD)
    edge(child.id, parent.id, on_parent_dead=OnParentDead.DEAD)
    step("order-7", parent.id, "shop.jobs.charge")
    step("order-7", child.id, "shop.jobs.ship")
    page = admin_client_.get(url("deadletter_change", child.id)).text
    summary = re.search(r'id="django-jobs-dead-parents".*?</div>', page, re.S).group()
    assert f"/admin/django_jobs/deadletter/{parent.id}/change/" in summary and "dead" in summary
    assert "?name=order-7" in page


# -- permissions and cancel


def test_viewing_needs_the_view_permission(login, diamond):
    nobody = login("view_job")
    assert nobody.get(url("workflowstep_changelist")).status_code == 403
    assert workflow_page(nobody, "order-42").status_code == 403
    viewer = login("view_workflowstep")
    assert viewer.get(url("workflowstep_changelist")).status_code == 200
    page = workflow_page(viewer, "order-42")
    assert page.status_code == 200
    assert "django-jobs-workflow-cancel" not in page.text  # no cancel permission: no button


def test_cancel_needs_the_cancel_permission(login, diamond):
    viewer = login("view_workflowstep")
    response = viewer.post(url("workflow_cancel"), {"name": "order-42"})
    assert response.status_code == 403
    assert Job.objects.filter(id=diamond["ship"]).exists()
    assert viewer.get(url("workflow_cancel")).status_code == 405


def test_cancel_moves_the_live_steps_and_asks_running_ones_to_stop(login, diamond):
    operator = login("view_workflowstep", "cancel_job")
    assert "django-jobs-workflow-cancel" in workflow_page(operator, "order-42").text
    response = operator.post(url("workflow_cancel"), {"name": "order-42"}, follow=True)
    assert response.status_code == 200
    (message,) = messages_of(response)
    assert "1 step(s) cancelled" in message and "1 running" in message
    letter = DeadLetter.objects.get(id=diamond["ship"])
    assert letter.reason == DeadReason.CANCELLED
    assert Job.objects.get(id=diamond["reserve"]).cancel_requested_at is not None
    # The finished and dead steps were left alone.
    assert DeadLetter.objects.get(id=diamond["confirm"]).reason == DeadReason.FATAL
    again = operator.post(url("workflow_cancel"), {"name": "order-42"}, follow=True)
    assert "no live step" in messages_of(again)[0] or "1 running" in messages_of(again)[0]


def test_cancel_takes_the_live_replay_of_a_dead_step_too(login):
    letter = DeadLetterFactory(name="tests.flaky")
    replay = JobFactory(name="tests.flaky")
    DeadLetter.objects.filter(id=letter.id).update(
        replayed_at=timezone.now(), replay_job_id=replay.id
    )
    waiting = JobFactory(name="tests.noop")
    step("retried", letter.id, "tests.flaky")
    step("retried", waiting.id, "tests.noop")
    operator = login("view_workflowstep", "cancel_job")
    page = workflow_page(operator, "retried")
    assert [s["state"] for s in page.context["steps"]] == ["waiting", "waiting"]
    response = operator.post(url("workflow_cancel"), {"name": "retried"}, follow=True)
    assert "2 step(s) cancelled" in messages_of(response)[0]
    assert not Job.objects.filter(id__in=[replay.id, waiting.id]).exists()
    assert DeadLetter.objects.get(id=replay.id).reason == DeadReason.CANCELLED


# -- hostile names

HOSTILE = [
    '<script>alert("x")</script>',
    "quote\" ' &amp; </svg><svg onload=alert(1)>",
    "заказ-№42 ☃ 注文 🚚",
    "w" * 255,
]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_workflow_and_handler_names_are_escaped(admin_client_, name):
    job = blocked_job(name=name[:200], waiting_for=1)
    parent = JobFactory(name="tests.noop", key=name)
    step(name, parent.id, "tests.noop", key=name)
    step(name, job.id, name[:200])
    edge(job.id, parent.id, key=name)
    for response in (
        admin_client_.get(url("workflowstep_changelist")),
        workflow_page(admin_client_, name),
        admin_client_.get(url("job_change", job.id)),
    ):
        assert response.status_code == 200
        page = response.text
        assert "<script>alert" not in page and "<svg onload" not in page
    page = workflow_page(admin_client_, name).text
    svg = re.search(r'<svg [^>]*class="django-jobs-graph".*?</svg>', page, re.S).group()
    assert svg.count("<svg") == 1 and svg.count("</svg>") == 1
    assert len(re.findall(r'<a class="django-jobs-node"', svg)) == 2
    # The name reads as itself on the page, and a long one is cut in the graph's boxes.
    assert (
        unescape(re.search(r'id="django-jobs-workflow-name">(.*?)</dd>', page, re.S).group(1))
        == name
    )
    for text in re.findall(r'<text [^>]*font-size="12"[^>]*>(.*?)</text>', svg):
        assert len(unescape(text)) <= graph.LABEL_CHARS


def test_layer_ranges_join_runs_and_stop_at_a_limit():
    per_layer = Counter({1: 3, 2: 1, 3: 1, 4: 1, 5: 2, 7: 2, 8: 5})
    assert layer_ranges(per_layer) == (
        [("1", 3), ("2–4", 1), ("5", 2), ("7", 2), ("8", 5)],
        0,
    )
    assert layer_ranges(per_layer, limit=2) == ([("1", 3), ("2–4", 1)], 3)


def test_the_graph_layers_ignore_cycles_and_foreign_parents():
    a, b, c, outside = (uuid.uuid4() for _ in range(4))
    layers = graph.layers([a, b, c], [(a, b), (b, c), (c, b), (outside, a)])
    assert layers[a] == 1 and layers[b] == layers[c] == 2


def test_the_admin_index_links_the_workflows_for_those_who_may_see_them(login):
    assert 'id="django-jobs-index-workflows"' in login("view_workflowstep").get("/admin/").text
    assert 'id="django-jobs-index-workflows"' not in login("view_job").get("/admin/").text
    app = login("view_workflowstep").get("/admin/django_jobs/").text
    assert 'href="/admin/django_jobs/workflowstep/"' in app


# -- rows written by the real API, run by the worker


@pytest.mark.django_db(transaction=True)
def test_a_workflow_run_by_the_worker_reads_right(admin_client_):
    from django_jobs import workflow
    from django_jobs.testing import drain

    with workflow(name="e2e") as w:
        a = w.enqueue("tests.noop", key="e2e-a")
        b = w.enqueue("tests.record", {"label": "b"}, after=[a])
        c = w.enqueue("tests.fatal", after=["e2e-a"])
        d = w.enqueue("tests.noop", {"n": 1}, after=[b, c], on_parent_dead="dead")
        e = w.enqueue("tests.noop", {"n": 2}, after=[d])
    drain()
    page = workflow_page(admin_client_, "e2e")
    states = {s["job_id"]: s["state"] for s in page.context["steps"]}
    assert states == {a.id: "done", b.id: "done", c.id: "dead", d.id: "dead", e.id: "blocked"}
    layers = {s["job_id"]: s["layer"] for s in page.context["steps"]}
    assert layers == {a.id: 1, b.id: 2, c.id: 2, d.id: 3, e.id: 4}
    svg = re.search(r'<svg [^>]*class="django-jobs-graph".*?</svg>', page.text, re.S).group()
    assert svg.count('class="django-jobs-edge"') == 5
    assert f"/admin/django_jobs/completionmarker/{a.id}/change/" in svg
    assert f"/admin/django_jobs/deadletter/{d.id}/change/" in svg
    listed = admin_client_.get(url("workflowstep_changelist")).context["rows"][0]
    assert (listed["done"], listed["dead"], listed["blocked"]) == (2, 2, 1)
    # The step that died with its parent names it; the one still waiting lists its dead parent.
    assert DeadLetter.objects.get(id=d.id).reason == DeadReason.PARENT_DEAD
    letter = admin_client_.get(url("deadletter_change", d.id)).text
    summary = re.search(r'id="django-jobs-dead-parents".*?</div>', letter, re.S).group()
    assert f"/admin/django_jobs/deadletter/{c.id}/change/" in summary
    assert f"/admin/django_jobs/job/{b.id}/" not in summary  # b finished: its marker
    assert f"/admin/django_jobs/completionmarker/{b.id}/change/" in summary
    waiting = admin_client_.get(url("job_change", e.id)).text
    assert f"/admin/django_jobs/deadletter/{d.id}/change/" in waiting
    assert "?name=e2e" in waiting
    # The dead step's own letter says who waits for it: replaying it would release them.
    dependents = re.search(r'id="django-jobs-dependents">(.*?)</ul>', letter, re.S).group(1)
    assert "1 still waiting for it, 0 released" in dependents
    assert f"/admin/django_jobs/job/{e.id}/change/" in dependents
    # c's edge to d stays unsatisfied: c died, and d died with it.
    dead_parent = admin_client_.get(url("deadletter_change", c.id)).text
    assert "1 still waiting for it, 0 released" in dead_parent
    assert f"/admin/django_jobs/deadletter/{d.id}/change/" in dead_parent


def _diamond_with_a_dying_step(fails):
    """a -> b, c -> d, where b dies `fails` times (each replayed and drained again)."""
    from django_jobs import workflow
    from django_jobs.testing import drain

    with workflow(name="order-4") as w:
        a = w.enqueue("tests.noop")
        b = w.enqueue("tests.fatal_runs", {"label": "b", "fails": fails}, after=[a])
        c = w.enqueue("tests.noop", after=[a])
        d = w.enqueue("tests.noop", after=[b, c])
    drain()
    dead = b.id
    for _ in range(fails):
        report = control.replay(DeadLetter.objects.filter(id=dead))
        dead = report.replayed[dead]
        drain()
    return a.id, b.id, c.id, d.id, dead


@pytest.mark.parametrize("fails", [1, 2])
def test_a_replayed_step_is_one_step_followed_to_its_replay(admin_client_, fails):
    a, b, c, d, last = _diamond_with_a_dying_step(fails)
    # One row per step: the row of b moved to the job that ran it last.
    assert WorkflowStep.objects.filter(workflow="order-4").count() == 4
    moved = WorkflowStep.objects.get(name="tests.fatal_runs")
    assert moved.job_id == last != b
    page = workflow_page(admin_client_, "order-4")
    rows = page.context["steps"]
    assert [row["state"] for row in rows] == ["done"] * 4
    legend = {state: count for state, _label, _color, count in page.context["legend"]}
    assert legend["done"] == 4 and page.context["total"] == 4
    svg = re.search(r'<svg [^>]*class="django-jobs-graph".*?</svg>', page.text, re.S).group()
    assert svg.count('class="django-jobs-node"') == 4
    assert svg.count('class="django-jobs-edge"') == 4  # d's edge to b's first run is b's
    layers = {row["job_id"]: row["layer"] for row in rows}
    assert layers == {a: 1, last: 2, c: 2, d: 3}
    listed = admin_client_.get(url("workflowstep_changelist")).context["rows"][0]
    assert (listed["steps"], listed["done"]) == (4, 4)
    # Each run's letter still leads to the workflow.
    letter = admin_client_.get(url("deadletter_change", b)).text
    assert "?name=order-4" in letter


def test_the_steps_table_is_in_layer_order_then_by_name(admin_client_):
    """Steps written together share created_at, and their ids need not follow the graph."""
    at = timezone.now()
    # Ids in the reverse of the graph's order: the last layer has the smallest id.
    a, b, c, d = (uuid.UUID(int=(0x0190 << 112) + n) for n in (4, 3, 2, 1))
    named = ((d, "shop.ship"), (c, "shop.reserve"), (b, "shop.confirm"))
    for job_id, name in named:
        JobFactory(id=job_id, name=name)
    MarkerFactory(job_id=a, name="shop.charge")
    for job_id, name in (*named, (a, "shop.charge")):
        step("same-ms", job_id, name, at=at)
    for child, parent in ((b, a), (c, a), (d, b), (d, c)):
        edge(child, parent, satisfied=True)
    rows = workflow_page(admin_client_, "same-ms").context["steps"]
    assert [(row["layer"], row["job_id"]) for row in rows] == [(1, a), (2, b), (2, c), (3, d)]


def test_the_steps_table_is_in_layer_order_past_the_graph_limit(admin_client_):
    at = timezone.now()
    ids = sorted(uuid7() for _ in range(GRAPH_LIMIT + 1))
    WorkflowStep.objects.bulk_create(
        [WorkflowStep(job_id=i, workflow="wide", name="tests.noop", created_at=at) for i in ids]
    )
    # The step with the smallest id waits for all the others: it comes last.
    Dependency.objects.bulk_create(
        [Dependency(job_id=ids[0], parent_key=str(p), parent_id=p, created_at=at) for p in ids[1:]]
    )
    last = workflow_page(admin_client_, "wide", p=4).context["steps"]
    assert [(row["layer"], row["job_id"]) for row in last] == [(2, ids[0])]
    first = workflow_page(admin_client_, "wide").context["steps"]
    assert [row["job_id"] for row in first] == ids[1:101]


def _parents_cell(page, job_id):
    return str(next(row["parents"] for row in page.context["steps"] if row["job_id"] == job_id))


def test_parents_are_named_by_their_step_names(admin_client_, diamond):
    outside = MarkerFactory(name="shop.jobs.audit", key="audit-42")
    edge(diamond["reserve"], outside.job_id, key="audit-42", satisfied=True)
    page = workflow_page(admin_client_, "order-42")
    # Blocked: the parents by name, with their states.
    ship = _parents_cell(page, diamond["ship"])
    assert "<code>shop.<wbr>jobs.<wbr>reserve</code>" in ship
    assert "<code>shop.<wbr>jobs.<wbr>confirm</code>" in ship
    assert f"<code>{diamond['reserve']}</code>" not in ship
    assert f"/admin/django_jobs/job/{diamond['reserve']}/change/" in ship
    # Not blocked: by name too, not a count; a parent outside the workflow by its key.
    reserve = _parents_cell(page, diamond["reserve"])
    assert "<code>shop.<wbr>jobs.<wbr>charge</code>" in reserve
    assert "<code>audit-<wbr>42</code>" in reserve
    charge = _parents_cell(page, diamond["charge"])
    assert charge == "—"
    # The job page's "waits for" names them the same way.
    waits = admin_client_.get(url("job_change", diamond["ship"])).text
    assert "<code>shop.<wbr>jobs.<wbr>confirm</code>" in waits


def test_a_replayed_parent_is_named_by_its_step(admin_client_):
    a, b, c, d, last = _diamond_with_a_dying_step(2)
    page = workflow_page(admin_client_, "order-4")
    parents = _parents_cell(page, d)
    assert "<code>tests.<wbr>fatal_<wbr>runs</code>" in parents and str(b) not in parents
    assert "<code>tests.<wbr>noop</code>" in parents


def test_parents_names_take_a_bounded_number_of_queries(
    admin_client_, django_assert_max_num_queries
):
    root = JobFactory(name="shop.root")
    step("fan", root.id, "shop.root")
    for i in range(40):
        child = blocked_job(name=f"shop.child{i}", waiting_for=1)
        step("fan", child.id, f"shop.child{i}")
        edge(child.id, root.id)
    with django_assert_max_num_queries(16):
        page = workflow_page(admin_client_, "fan")
    assert _parents_cell(page, child.id).count("<code>shop.<wbr>root</code>") == 1
