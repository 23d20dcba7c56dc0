"""The workflow pages: every workflow with its steps' states, and one page per workflow.

The list groups WorkflowStep rows by workflow name, a page of names at a time; the
states are counted for the names on the page only, in one grouped query (the first
hop of a step's work in SQL, replayed letters followed in Python). A workflow's page
draws its graph (graph.py) when it has at most GRAPH_LIMIT steps; a bigger one gets
its steps per layer and a paginated table. Cancelling a workflow needs the jobs'
cancel permission, as the job lists' action does.
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count, F, Min, QuerySet, Window
from django.db.models.functions import RowNumber
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_jobs import conf
from django_jobs.admin import graph, steps
from django_jobs.admin.base import AnyModelAdmin, log_changes
from django_jobs.admin.databases import PARAMETER, chosen, keep, several
from django_jobs.admin.display import EMPTY, cell, showable, when
from django_jobs.models import DeadLetter, Dependency, Job, WorkflowStep
from django_jobs.store import JobStore

# Steps drawn as a graph at most; past it, a page of counts per layer and a table.
GRAPH_LIMIT = 300
WORKFLOWS_PER_PAGE = 50
STEPS_PER_PAGE = 100
PARENTS_SHOWN = 20  # per blocked step in the table, and on a job's page
# Parents listed in a drawn workflow's table in all: 300 steps that each wait for all
# the earlier ones list 3 each (and how many more), not 20 (6,000 items, 1.2 MB).
TABLE_PARENTS = 1000
LAYER_ROWS = 100  # rows of the layer table of a workflow too big to draw
JOB_PAGE_PARENTS = 100  # parents listed on a job's or a letter's page


def admin_url(site: str, where: steps.Where, alias: str | None = None) -> str | None:
    """The admin page of the row that shows where the work is (None: no row).

    `alias`: the job database the row is in (None, or the default: no parameter).
    """
    model = where.admin_model
    if model is None:
        return None
    return keep(reverse(f"{site}:django_jobs_{model}_change", args=[where.current]), alias)


def workflow_url(site: str, name: str, alias: str | None = None) -> str:
    """The page of workflow `name` (of job database `alias`, None or the default: none said)."""
    url = reverse(f"{site}:django_jobs_workflow") + "?" + urlencode({"name": name})
    return keep(url, alias)


def state_counts(step_rows: QuerySet[Any], alias: str) -> dict[str, Counter[str]]:
    """Count the steps per workflow and state (replayed letters followed to their jobs)."""
    rows = (
        step_rows.order_by()
        .annotate(state=steps.state_annotation())
        .values("workflow", "state")
        .annotate(n=Count("pk"))
    )
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    replayed = False
    for row in rows:
        if row["state"] == steps.REPLAYED:
            replayed = True
        else:
            counts[row["workflow"]][row["state"]] += row["n"]
    if replayed:
        again = step_rows.order_by().annotate(state=steps.state_annotation())
        pairs = list(again.filter(state=steps.REPLAYED).values_list("job_id", "workflow"))
        where = steps.resolve([job_id for job_id, _ in pairs], alias)
        for job_id, workflow in pairs:
            counts[workflow][where[job_id].state] += 1
    return counts


def later_steps(
    parent_ids: Iterable[uuid.UUID], step_ids: Iterable[uuid.UUID], alias: str
) -> dict[uuid.UUID, uuid.UUID]:
    """Map the parents that are no step row to the step a replay moved their row to.

    An edge keeps the id its parent had when it was written; a replay of that
    parent moves the parent's step row to the new job. One query a replay hop,
    none when every parent is a step row.
    """
    known = set(step_ids)
    unknown = {parent for parent in parent_ids if parent not in known}
    if not unknown:
        return {}
    return {old: new for old, new in steps.replayed_as(unknown, alias).items() if new in known}


def step_order(
    layer: dict[Any, int], job_id: uuid.UUID, created_at: Any, name: str
) -> tuple[Any, ...]:
    """Sort key of a workflow's steps: by layer, then as written, then by name and id.

    The steps of one workflow(...) block share created_at (and ids made in one
    millisecond are not ordered), so their names order them within a layer.
    """
    return (layer.get(job_id, 1), created_at, name, job_id)


def parents_of(job_ids: Iterable[uuid.UUID], alias: str) -> dict[uuid.UUID, list[Dependency]]:
    """The Dependency rows of each job, oldest first."""
    found: dict[uuid.UUID, list[Dependency]] = defaultdict(list)
    ids = list(job_ids)
    for start in range(0, len(ids), steps.CHUNK):
        edges = Dependency.objects.using(alias).filter(job_id__in=ids[start : start + steps.CHUNK])
        for edge in edges.order_by("created_at", "id"):
            found[edge.job_id].append(edge)
    return found


def first_parents(
    job_ids: Iterable[uuid.UUID], alias: str, limit: int = PARENTS_SHOWN
) -> dict[uuid.UUID, list[Dependency]]:
    """The first `limit` Dependency rows of each job, oldest first (a window per job).

    A step that waits for 299 others lists 20 of them: not 44,850 rows made models.
    """
    rank = Window(RowNumber(), partition_by=[F("job_id")], order_by=[F("created_at"), F("id")])
    found: dict[uuid.UUID, list[Dependency]] = defaultdict(list)
    ids = list(job_ids)
    for start in range(0, len(ids), steps.CHUNK):
        edges = (
            Dependency.objects.using(alias)
            .filter(job_id__in=ids[start : start + steps.CHUNK])
            .annotate(rank=rank)
            .filter(rank__lte=limit)
        )
        for edge in edges.order_by("job_id", "created_at", "id"):
            found[edge.job_id].append(edge)
    return found


def parents_list(
    site: str,
    edges: Sequence[Dependency],
    alias: str,
    limit: int = PARENTS_SHOWN,
    where: dict[uuid.UUID, steps.Where] | None = None,
    total: int | None = None,
    names: dict[uuid.UUID, str] | None = None,
) -> SafeString | str:
    """A list of parents: step name (or key), state now (linked), satisfied or not.

    `where` may hold the parents already resolved (a table's rows, in one go);
    `total` is how many edges there are when `edges` holds only the first ones;
    `names` the step names of the parents that are steps of the same workflow.
    """
    total = len(edges) if total is None else total
    if not edges:
        return EMPTY
    shown = list(edges[:limit])
    if where is None or any(e.parent_id not in where for e in shown):
        where = steps.resolve([e.parent_id for e in shown], alias)
    items = []
    for edge in shown:
        at = where[edge.parent_id]
        url = admin_url(site, at, alias)
        state = format_html('<a href="{}">{}</a>', url, at.label) if url else at.label
        if edge.satisfied_at is not None:
            done = format_html(
                '<span class="django-jobs-satisfied" title="{}">✓ {}</span>',
                when(edge.satisfied_at),
                _("satisfied"),
            )
        else:
            done = format_html(
                '<strong class="django-jobs-unsatisfied">{}</strong>', _("not satisfied yet")
            )
            if at.state == steps.DEAD:  # what puts it right: the parent's replay, and success
                done = format_html("{} ({})", done, _("replay the parent to release it"))
        items.append((parent_label(edge, names), state, done))
    more = _more(total, len(shown))
    return format_html(
        '<ul class="django-jobs-parents">{}{}</ul>',
        format_html_join("", "<li>{}: {}, {}</li>", items),
        more,
    )


def parent_label(edge: Dependency, names: dict[uuid.UUID, str] | None) -> SafeString:
    """Name a parent: its step name (and key) when a step of the workflow, else its key."""
    name = (names or {}).get(edge.parent_id)
    key = format_html("<code>{}</code>", cell(edge.parent_key, 60, name=True))
    if name is None:
        return key
    shown = format_html("<code>{}</code>", cell(name, 60, name=True))
    if edge.parent_key == str(edge.parent_id):  # no key of its own: its id says nothing more
        return shown
    return format_html('{} <span class="django-jobs-quiet">({} {})</span>', shown, _("key"), key)


def parents_names(
    edges: Sequence[Dependency],
    names: dict[uuid.UUID, str],
    limit: int = PARENTS_SHOWN,
    total: int | None = None,
) -> SafeString | str:
    """The parents of a step that does not wait (any more), by name: no state, no query."""
    if not edges:
        return EMPTY
    shown = [(parent_label(edge, names),) for edge in edges[:limit]]
    return format_html(
        '<ul class="django-jobs-parents">{}{}</ul>',
        format_html_join("", "<li>{}</li>", shown),
        _more(len(edges) if total is None else total, len(shown)),
    )


def _more(total: int, shown: int) -> SafeString | str:
    if total <= shown:
        return ""
    return format_html(
        '<li class="django-jobs-quiet">{}</li>', _("and %(n)s more") % {"n": total - shown}
    )


@admin.register(WorkflowStep)
class WorkflowStepAdmin(AnyModelAdmin):
    """The workflow list and pages; the steps themselves are shown on their workflow's page."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_jobs.cancel_job")  # as the job lists' action

    def get_urls(self) -> list[Any]:
        wrap = self.admin_site.admin_view
        return [
            path("workflow/", wrap(self.workflow_view), name="django_jobs_workflow"),
            path(
                "workflow/cancel/",
                wrap(self.cancel_view),
                name="django_jobs_workflow_cancel",
            ),
            *super().get_urls(),
        ]

    def _context(self, request: HttpRequest, title: Any, alias: str) -> dict[str, Any]:
        list_url = reverse(f"{self.admin_site.name}:django_jobs_workflowstep_changelist")
        return {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "list_url": keep(list_url, alias),
            # With several job databases, the one shown (the pages' heading says it).
            "database": alias if several() else None,
        }

    def _refuse_nul(self, request: HttpRequest) -> HttpResponse | None:
        data = request.POST if request.method == "POST" else request.GET
        if any("\x00" in text for key, values in data.lists() for text in (key, *values)):
            return HttpResponseBadRequest(_("A NUL character is not allowed in a workflow name."))
        return None

    # -- the list

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        refused = self._refuse_nul(request)
        if refused is not None:
            return refused
        term = request.GET.get("q", "").strip()
        alias = chosen(request)
        all_steps = WorkflowStep.objects.using(alias)
        found = all_steps.filter(workflow__icontains=term) if term else all_steps
        groups = (
            found.order_by()
            .values("workflow")
            .annotate(steps=Count("pk"), first=Min("created_at"))
            .order_by("-first", "workflow")
        )
        page = Paginator(groups, WORKFLOWS_PER_PAGE).get_page(request.GET.get("p"))
        rows = list(page.object_list)
        names = [row["workflow"] for row in rows]
        counts = state_counts(all_steps.filter(workflow__in=names), alias)
        site = self.admin_site.name
        table = []
        for row in rows:
            n = counts[row["workflow"]]
            table.append(
                {
                    "name": cell(row["workflow"], 80, name=True),
                    "url": workflow_url(site, row["workflow"], alias),
                    "steps": row["steps"],
                    "done": n[steps.DONE],
                    "running": n["running"],
                    "blocked": n["blocked"],
                    "waiting": n["waiting"] + n["scheduled"],
                    "dead": n[steps.DEAD],
                    "gone": n[steps.GONE],
                    "first": when(row["first"]),
                }
            )
        kept = {PARAMETER: alias} if alias != conf.database() else {}
        context = {
            **self._context(request, _("Workflows"), alias),
            "rows": table,
            "page": page,
            "term": term,
            "page_links": _page_links(page, {**kept, **({"q": term} if term else {})}),
            "databases": self._database_links(request, alias, term),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/django_jobs/workflows.html", context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """A step's page is its workflow's page."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        step_id = _uuid(object_id)
        alias = chosen(request)
        rows = WorkflowStep.objects.using(alias)
        step = None if step_id is None else rows.filter(job_id=step_id).first()
        if step is None:
            raise Http404(_("No such workflow step."))
        return HttpResponseRedirect(workflow_url(self.admin_site.name, step.workflow, alias))

    # -- one workflow

    def workflow_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        refused = self._refuse_nul(request)
        if refused is not None:
            return refused
        name = request.GET.get("name")
        alias = chosen(request)
        if name is None:
            return HttpResponseRedirect(
                keep(reverse(f"{self.admin_site.name}:django_jobs_workflowstep_changelist"), alias)
            )
        step_rows = WorkflowStep.objects.using(alias).filter(workflow=name)
        total = step_rows.count()
        if not total:
            raise Http404(_("No workflow has this name."))
        site = self.admin_site.name
        counts = state_counts(step_rows, alias)[name]
        context = {
            **self._context(request, _("Workflow"), alias),
            "crumb": cell(name, 120),
            "name": showable(name),
            "total": total,
            "legend": [
                (state, steps.LABELS[state], graph.COLORS[state][0], counts[state])
                for state in steps.ORDER
            ],
            "first": when(step_rows.aggregate(first=Min("created_at"))["first"]),
            "live": sum(counts[state] for state in steps.LIVE),
            "cancel_url": keep(reverse(f"{site}:django_jobs_workflow_cancel"), alias),
            "can_cancel": self.has_cancel_permission(request),
            "graph_limit": GRAPH_LIMIT,
        }
        if total <= GRAPH_LIMIT:
            rows = list(step_rows.order_by())
            ids = [row.job_id for row in rows]
            # Every edge for the layers, as two columns; models only for the table's first.
            pairs = list(
                Dependency.objects.using(alias)
                .filter(job_id__in=ids)
                .order_by("created_at", "id")
                .values_list("parent_id", "job_id")
            )
            totals = Counter(child for _parent, child in pairs)
            per_step = max(3, min(PARENTS_SHOWN, TABLE_PARENTS // max(len(ids), 1)))
            parents = first_parents(ids, alias, per_step)
            later = later_steps({parent for parent, _child in pairs}, ids, alias)
            edges = [(later.get(parent, parent), child) for parent, child in pairs]
            layer = graph.layers(ids, edges)
            rows.sort(key=lambda row: step_order(layer, row.job_id, row.created_at, row.name))
            names = {row.job_id: row.name for row in rows}
            where = steps.resolve(ids, alias)
            nodes = [
                graph.Node(
                    key=row.job_id,
                    name=showable(row.name),
                    state=where[row.job_id].state,
                    state_label=where[row.job_id].label,
                    url=admin_url(site, where[row.job_id], alias),
                    title=f"{showable(row.name)}: {where[row.job_id].label} ({row.job_id})",
                )
                for row in rows
            ]
            context["svg"] = graph.draw(
                nodes, edges, title=f"{_('Workflow')} {showable(name)}", layer=layer
            )
            context["steps"] = self._step_rows(
                rows, where, parents, layer, names, later, alias, totals
            )
        else:
            every = list(step_rows.order_by().values_list("job_id", "created_at", "name"))
            ids = [job_id for job_id, _at, _name in every]
            names = {job_id: step_name for job_id, _at, step_name in every}
            # Only the two columns of the edges, in one semi-join: rows, not models.
            edges = list(
                Dependency.objects.using(alias)
                .filter(job_id__in=step_rows.values("job_id"))
                .values_list("parent_id", "job_id")
            )
            later = later_steps([parent for parent, _child in edges], ids, alias)
            edges = [(later.get(parent, parent), child) for parent, child in edges]
            layer = graph.layers(ids, edges)
            context["layers"], context["more_layers"] = layer_ranges(Counter(layer.values()))
            every.sort(key=lambda row: step_order(layer, *row))
            page = Paginator([job_id for job_id, _at, _name in every], STEPS_PER_PAGE).get_page(
                request.GET.get("p")
            )
            page_ids = list(page.object_list)
            by_id = {row.job_id: row for row in step_rows.order_by().filter(job_id__in=page_ids)}
            rows = [by_id[job_id] for job_id in page_ids if job_id in by_id]
            where = steps.resolve(page_ids, alias)
            parents = parents_of(page_ids, alias)
            context["steps"] = self._step_rows(rows, where, parents, layer, names, later, alias)
            context["page"] = page
            kept = {PARAMETER: alias} if alias != conf.database() else {}
            context["page_links"] = _page_links(page, {**kept, "name": name})
        return TemplateResponse(request, "admin/django_jobs/workflow.html", context)

    def _step_rows(
        self,
        rows: list[WorkflowStep],
        where: dict[uuid.UUID, steps.Where],
        parents: dict[uuid.UUID, list[Dependency]],
        layer: dict[Any, int],
        step_names: dict[uuid.UUID, str],
        later: dict[uuid.UUID, uuid.UUID],
        alias: str,
        totals: Counter[uuid.UUID] | None = None,
    ) -> list[dict[str, Any]]:
        """The table's rows; `step_names` has every step's, `later` the replays' moves.

        `totals`: how many parents each step has, when `parents` holds only the first.
        """
        site = self.admin_site.name
        # The parents by their step names (the edge of a replayed one names its first run).
        shown = {e.parent_id for edges in parents.values() for e in edges[:PARENTS_SHOWN]}
        names = {
            parent: step_names[later.get(parent, parent)]
            for parent in shown
            if later.get(parent, parent) in step_names
        }
        blocked = [row.job_id for row in rows if where[row.job_id].state == "blocked"]
        # The parents of every blocked row, resolved together: not a few queries per row.
        parent_ids = {e.parent_id for job_id in blocked for e in parents[job_id][:PARENTS_SHOWN]}
        parent_where = {**where, **steps.resolve(parent_ids - set(where), alias)}
        table = []
        for row in rows:
            at = where[row.job_id]
            edges = parents.get(row.job_id, [])
            total = len(edges) if totals is None else totals[row.job_id]
            table.append(
                {
                    "layer": layer.get(row.job_id, 1),
                    "name": cell(row.name, 80, name=True),
                    "key": cell(row.key, 40, name=True),
                    "state": at.state,
                    "label": at.label,
                    "reason": at.reason,
                    "url": admin_url(site, at, alias),
                    "job_id": row.job_id,
                    "current": at.current if at.current != row.job_id else None,
                    "created": when(row.created_at),
                    # What a blocked step waits for, with states; the others' parents by name only.
                    "parents": parents_list(
                        site, edges, alias, where=parent_where, total=total, names=names
                    )
                    if at.state == "blocked"
                    else parents_names(edges, names, total=total),
                }
            )
        return table

    # -- cancel

    def cancel_view(self, request: HttpRequest) -> HttpResponse:
        """Cancel the steps of a workflow that have not finished (POST)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not (self.has_view_permission(request) and self.has_cancel_permission(request)):
            raise PermissionDenied
        refused = self._refuse_nul(request)
        if refused is not None:
            return refused
        name = request.POST.get("name", "")
        by = request.user.get_username()
        alias = chosen(request)  # the form posts to the cancel URL of its page's database
        live = Job.objects.using(alias).filter(
            id__in=WorkflowStep.objects.using(alias).filter(workflow=name).values("job_id")
        )
        names = dict(live.values_list("id", "name"))
        # The store's cancel of a workflow's steps: a replayed step's replay is a step too.
        store = JobStore(alias)
        report = store.cancel_workflow(name, by=by)
        # A running step's handler is stopped by its worker: flag it for the next heartbeat.
        store.request_cancel(Job.objects.filter(id__in=report.running))
        if report.cancelled:
            moved = f"Cancelled with workflow {name[:100]}: moved from the live jobs."
            entries = [
                (pk, f"{names.get(pk, '')} {pk} (cancelled)", moved) for pk in report.cancelled
            ]
            log_changes(request, DeadLetter, entries, CHANGE)
        if report.running:
            asked = f"Cancel requested with workflow {name[:100]}."
            entries = [(pk, f"{names.get(pk, '')} {pk}", asked) for pk in report.running]
            log_changes(request, Job, entries, CHANGE)
        message = _(
            "Workflow %(name)s: %(cancelled)s step(s) cancelled (moved to the dead letters, "
            "where they can be replayed)"
        ) % {"name": showable(name)[:100], "cancelled": len(report.cancelled)}
        if report.running:
            message += _("; asked the workers of %(n)s running step(s) to stop them") % {
                "n": len(report.running)
            }
        if not names:
            message = _("Workflow %(name)s has no live step: nothing to cancel") % {
                "name": showable(name)[:100]
            }
        self.message_user(request, f"{message}.", messages.SUCCESS if names else messages.WARNING)
        return HttpResponseRedirect(workflow_url(self.admin_site.name, name, alias))

    def _database_links(
        self, request: HttpRequest, alias: str, term: str
    ) -> list[tuple[str, str, bool]]:
        """(alias, the list's URL on it, whether shown) for each job database; none for one."""
        if not several():
            return []
        base = reverse(f"{self.admin_site.name}:django_jobs_workflowstep_changelist")
        links = []
        for other in conf.databases():
            query = {PARAMETER: other, **({"q": term} if term else {})}
            links.append((other, f"{base}?{urlencode(query)}", other == alias))
        return links


def layer_ranges(
    per_layer: Counter[int], limit: int = LAYER_ROWS
) -> tuple[list[tuple[str, int]], int]:
    """Runs of layers with as many steps each, ("2-4999", 1), at most limit of them.

    A chain of 50,000 steps has 50,000 layers: one row each would be the page's bulk.
    Returns the rows and how many layers the rows left out.
    """
    rows: list[tuple[int, int, int]] = []  # first layer, last layer, steps in each
    for number in sorted(per_layer):
        count = per_layer[number]
        if rows and rows[-1][2] == count and rows[-1][1] == number - 1:
            rows[-1] = (rows[-1][0], number, count)
        else:
            rows.append((number, number, count))
    shown = [(f"{a}" if a == b else f"{a}–{b}", n) for a, b, n in rows[:limit]]
    left = sum(b - a + 1 for a, b, _n in rows[limit:])
    return shown, left


def _uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(text).strip())
    except ValueError:
        return None


def _page_links(page: Any, params: dict[str, str]) -> list[tuple[Any, str | None]]:
    """(label, url or None for the current page and the gaps) for a page's paginator."""
    paginator = page.paginator
    if paginator.num_pages <= 1:
        return []
    links: list[tuple[Any, str | None]] = []
    for number in paginator.get_elided_page_range(page.number, on_each_side=2, on_ends=1):
        if number == paginator.ELLIPSIS or number == page.number:
            links.append((number, None))
        else:
            links.append((number, "?" + urlencode({**params, "p": number})))
    return links


class WorkflowFields:
    """A job's or a letter's workflow: a link to its page, and the parents it waits for."""

    admin_site: admin.AdminSite
    WORKFLOW_FIELDS = ("workflow_link", "parents_table", "dependents_list")

    def workflow_fieldset(self, obj: Any) -> list[tuple[Any, dict[str, Any]]]:
        """The Workflow section of the page: for a step, or a job that waits or is waited for."""
        if obj is None:
            return []
        alias = obj._state.db or WorkflowStep.objects.db
        edges = Dependency.objects.using(alias)
        if not (
            edges.filter(job_id=obj.pk).exists()
            or edges.filter(parent_key=_key_of(obj)).exists()
            or steps.step_of(obj.pk, alias) is not None
        ):
            return []
        return [(_("Workflow"), {"fields": list(self.WORKFLOW_FIELDS)})]

    @admin.display(description=_("workflow"))
    def workflow_link(self, obj: Any) -> SafeString | str:
        alias = obj._state.db or WorkflowStep.objects.db
        found = steps.step_of(obj.pk, alias)
        if found is None:
            return EMPTY
        workflow, step_id = found
        url = workflow_url(self.admin_site.name, workflow, alias)
        link = format_html(
            '<a href="{}" id="django-jobs-workflow-link">{}</a>', url, cell(workflow, 120)
        )
        if step_id != obj.pk:
            if isinstance(obj, DeadLetter) and obj.replay_job_id is not None:
                return format_html("{} ({} {})", link, _("the step runs now as"), step_id)
            return format_html("{} ({} {})", link, _("replayed from step"), step_id)
        return link

    @admin.display(description=_("waits for"))
    def parents_table(self, obj: Any) -> SafeString | str:
        alias = obj._state.db or WorkflowStep.objects.db
        # The first hundred: a step after a 10,000-step fan-out has 10,000 edges.
        rows = Dependency.objects.using(alias).filter(job_id=obj.pk).order_by("created_at", "id")
        edges = list(rows[:JOB_PAGE_PARENTS])
        total = rows.count() if len(edges) == JOB_PAGE_PARENTS else len(edges)
        names = _names_in_workflow(obj.pk, [edge.parent_id for edge in edges], alias)
        return parents_list(
            self.admin_site.name, edges, alias, limit=JOB_PAGE_PARENTS, total=total, names=names
        )

    @admin.display(description=_("waited for by"))
    def dependents_list(self, obj: Any) -> SafeString | str:
        """The jobs waiting for this one: replaying its letter (or its success) releases them."""
        alias = obj._state.db or WorkflowStep.objects.db
        edges = Dependency.objects.using(alias).filter(parent_key=_key_of(obj))
        waiting = edges.filter(satisfied_at__isnull=True)
        total, unsatisfied = edges.count(), waiting.count()
        if not total:
            return EMPTY
        shown = list(waiting.order_by("created_at", "id").values_list("job_id", flat=True)[:20])
        where = steps.resolve(shown, alias)
        site = self.admin_site.name
        items = []
        for job_id in shown:
            at = where[job_id]
            url = admin_url(site, at, alias)
            label = format_html('<a href="{}">{}</a>', url, at.label) if url else at.label
            items.append((job_id, label))
        summary = _("%(waiting)s still waiting for it, %(released)s released") % {
            "waiting": unsatisfied,
            "released": total - unsatisfied,
        }
        return format_html(
            '<p id="django-jobs-dependents">{}</p><ul class="django-jobs-parents">{}</ul>',
            summary,
            format_html_join("", "<li><code>{}</code>: {}</li>", items),
        )


def _names_in_workflow(
    job_id: uuid.UUID, parent_ids: list[uuid.UUID], alias: str
) -> dict[uuid.UUID, str]:
    """The step names of the parents that are steps of job_id's workflow (a few queries)."""
    if not parent_ids:
        return {}
    found = steps.step_of(job_id, alias)
    if found is None:
        return {}
    later = steps.replayed_as(parent_ids, alias)
    candidates = set(parent_ids) | set(later.values())
    rows = WorkflowStep.objects.using(alias).filter(workflow=found[0], job_id__in=candidates)
    by_id = dict(rows.values_list("job_id", "name"))
    names = {}
    for parent in parent_ids:
        # Its row moved with its replay; a row written before replays moved stays.
        name = by_id.get(later.get(parent, parent), by_id.get(parent))
        if name is not None:
            names[parent] = name
    return names


def _key_of(obj: Any) -> str:
    """The idempotency key a job's or a letter's dependents wait for: its key, or its id."""
    return str(obj.key) if obj.key is not None else str(obj.pk)
