"""The workflow graph draws at most graph.EDGE_LIMIT edges, as it draws at most 300 steps.

A 300-step workflow (the drawing limit) in which every step waits for all the earlier
ones has 44,850 edges: drawn one path each, 1.75 s and 9.3 MB of inline SVG. Past the
bound the graph says how many edges it left out; the table still lists every step.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_jobs.admin import graph, workflows
from tests.admin_fixtures import url

pytestmark = pytest.mark.django_db

STEPS = workflows.GRAPH_LIMIT

# One workflow as enqueue and settle leave it: the first step done (its marker), every
# later one blocked and waiting for all the steps before it.
FILL = """
CREATE TEMP TABLE dense_fill AS
SELECT n, gen_random_uuid() AS id FROM generate_series(1, %(steps)s) AS n;

INSERT INTO django_jobs_workflow_step (job_id, workflow, name, key, created_at)
SELECT id, %(name)s, 'tests.noop', NULL, now() - interval '1 hour' + n * interval '1 ms'
FROM dense_fill;

INSERT INTO django_jobs_marker (job_id, key, name, queue, attempts, enqueued_at, completed_at,
                                worker_id, result)
SELECT id, id::text, 'tests.noop', 'default', 1, now(), now(), 'h:1:a', NULL
FROM dense_fill WHERE n = 1;

INSERT INTO django_jobs_job (id, name, queue, payload, priority, run_at, enqueued_at, attempts,
                             max_attempts, errors, waiting_for, dependents)
SELECT id, 'tests.noop', 'default', '{}', 0, '9000-01-01', now(), 0, 3, '[]'::jsonb, n - 1,
       %(steps)s - n
FROM dense_fill WHERE n > 1;

INSERT INTO django_jobs_dependency (job_id, parent_key, parent_id, on_parent_dead, created_at,
                                    satisfied_at)
SELECT child.id, parent.id::text, parent.id, 'wait', now(),
       CASE WHEN parent.n = 1 THEN now() END
FROM dense_fill AS child JOIN dense_fill AS parent ON parent.n < child.n;

DROP TABLE dense_fill;
ANALYZE django_jobs_workflow_step;
ANALYZE django_jobs_job;
ANALYZE django_jobs_dependency;
"""


def fill(name, steps):
    with connection.cursor() as cursor:
        cursor.execute(FILL, {"steps": steps, "name": name})


def workflow_page(client, name):
    client.get(url("workflow"), {"name": name})  # warm: templates, content types
    with CaptureQueriesContext(connection) as queries:
        started = time.monotonic()
        response = client.get(url("workflow"), {"name": name})
        elapsed = time.monotonic() - started
    assert response.status_code == 200
    return response, len(queries), elapsed


@pytest.mark.postgres
@pytest.mark.slow
def test_a_dense_300_step_workflow_draws_a_bounded_graph(admin_client_, capsys):
    fill("dense", STEPS)
    fill("small", 12)  # 66 edges: all drawn
    dense, dense_queries, dense_time = workflow_page(admin_client_, "dense")
    small, small_queries, small_time = workflow_page(admin_client_, "small")
    edges = STEPS * (STEPS - 1) // 2
    with capsys.disabled():
        print(
            f"\n[workflow graph] {STEPS} steps, {edges:,} edges: {dense_time * 1000:.0f} ms, "
            f"{len(dense.content):,} bytes, {dense_queries} queries; 12 steps, 66 edges: "
            f"{small_time * 1000:.0f} ms, {len(small.content):,} bytes, {small_queries} queries"
        )
    svg = dense.context["svg"]
    assert svg.count('class="django-jobs-edge"') == graph.EDGE_LIMIT
    assert svg.count('class="django-jobs-node"') == STEPS  # every step drawn
    left = f"{edges - graph.EDGE_LIMIT:,}"
    assert f"{left} more edges not drawn" in dense.text
    assert len(dense.context["steps"]) == STEPS  # and every step listed
    # Each step is drawn with its edge from the parent that puts it in its layer.
    assert dense.text.count('class="django-jobs-step"') == STEPS
    assert len(dense.content) < 2 * 1024 * 1024
    assert dense_queries <= small_queries + 4
    # A small workflow: every edge drawn, no note.
    assert small.context["svg"].count('class="django-jobs-edge"') == 66
    assert "not drawn" not in small.text


def test_each_step_keeps_the_edge_from_its_latest_parent():
    # 80 steps, each after all the earlier ones: 3,160 edges, the latest parent's last.
    count = 80
    nodes = [
        graph.Node(i, f"tests.step_{i}", "blocked", "blocked", None, str(i)) for i in range(count)
    ]
    edges = [(parent, child) for child in range(count) for parent in range(child)]
    svg = graph.draw(nodes, edges, title="dense")
    assert svg.count('class="django-jobs-edge"') == graph.EDGE_LIMIT
    assert f"{len(edges) - graph.EDGE_LIMIT:,} more edges not drawn" in svg
    kept = graph.bounded_edges(edges, list(range(1, count + 1)))
    assert len(kept) == graph.EDGE_LIMIT
    assert {(child - 1, child) for child in range(1, count)} <= set(kept)
    assert kept == sorted(kept, key=edges.index)  # in the order given
    # Under the bound every edge is drawn, and nothing is said.
    few = graph.draw(nodes[:10], edges[:45], title="small")
    assert few.count('class="django-jobs-edge"') == 45 and "not drawn" not in few
