"""The operators' admin: dead letters to inspect and replay, live jobs, markers, a dashboard.

Everything here is read-only. The only writes are explicit actions (replay,
delete, run now, cancel), each gated by its own permission, each calling a
named state change of the models, each reported with ``message_user`` and
recorded as a ``LogEntry``. Payloads are shown with the ``MASK_KEYS`` masked.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from datetime import datetime
from functools import cached_property
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import unquote
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from rangefilter.filters import DateTimeRangeFilter

from django_jobs import dashboard, payloads
from django_jobs.models import (
    CompletionMarker,
    DeadLetter,
    Job,
    JobState,
    ReplayReport,
    error_summary,
)

# Rows counted exactly before the change lists switch to the planner's estimate.
EXACT_COUNT_LIMIT = 10_000
EMPTY = "—"


class EstimatedCountPaginator(Paginator):
    """Count exactly up to EXACT_COUNT_LIMIT rows, then ask PostgreSQL's planner.

    An exact ``COUNT(*)`` reads every matching row: on a million completion
    markers that is the slowest query of the page. Counting at most a limit
    reads a bounded slice along the list's index; past it, "about N" is enough
    to page through.
    """

    estimated = False

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return len(queryset)
        exact = queryset[: EXACT_COUNT_LIMIT + 1].count()
        if exact <= EXACT_COUNT_LIMIT:
            return exact
        if connections[queryset.db].vendor != "postgresql":
            return queryset.count()  # SQLite counts fast, and has no estimate to offer
        self.estimated = True
        try:
            plan = json.loads(queryset.explain(format="json"))
            estimate = int(plan[0]["Plan"]["Plan Rows"])
        except (ValueError, KeyError, IndexError, TypeError):
            estimate = 0
        return max(exact, estimate)


def pretty_payload(text: str) -> SafeString:
    """Return a payload as indented JSON with the MASK_KEYS masked, in a <pre>."""
    try:
        value = payloads.decode(text)
    except ValueError:
        return format_html(
            '<p class="errornote">{}</p><pre class="django-jobs-json">{}</pre>',
            _("Not valid JSON (shown as stored):"),
            text,
        )
    shown = json.dumps(payloads.mask(value), indent=2, ensure_ascii=False, sort_keys=False)
    return format_html('<pre class="django-jobs-json">{}</pre>', shown)


def attempt_history(errors: list[dict[str, Any]] | None) -> SafeString | str:
    """Return every attempt's error as a table, tracebacks folded (no script needed)."""
    if not errors:
        return EMPTY
    rows = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        (
            (
                error.get("attempt", ""),
                _format_when(error.get("at")),
                error.get("worker", "") or EMPTY,
                error_summary(error) or EMPTY,
                format_html(
                    "<details><summary>{}</summary><pre>{}</pre></details>",
                    _("traceback"),
                    error["traceback"],
                )
                if error.get("traceback")
                else EMPTY,
            )
            for error in errors
            if isinstance(error, dict)
        ),
    )
    return format_html(
        '<table class="django-jobs-attempts"><thead><tr><th>{}</th><th>{}</th><th>{}</th>'
        "<th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>",
        _("attempt"), _("at"), _("worker"), _("error"), _("traceback"), rows,
    )  # fmt: skip


def _format_when(value: Any) -> str:
    if not isinstance(value, str):
        return EMPTY
    parsed = parse_datetime(value)
    if parsed is None:
        return value
    if timezone.is_aware(parsed):
        parsed = timezone.localtime(parsed)
    return parsed.strftime("%Y-%m-%d %H:%M:%S")


def _username(request: HttpRequest) -> str:
    return request.user.get_username()


def _log(
    request: HttpRequest, model: type[Model], entries: Iterable[tuple[Any, str, str]], flag: int
) -> None:
    """Write one LogEntry per (pk, repr, message), in one INSERT."""
    content_type = ContentType.objects.get_for_model(model, for_concrete_model=False)
    LogEntry.objects.bulk_create(
        [
            LogEntry(
                user_id=request.user.pk,
                content_type_id=content_type.pk,
                object_id=str(pk),
                object_repr=text[:200],
                action_flag=flag,
                change_message=message,
            )
            for pk, text, message in entries
        ]
    )


def _uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text.strip())
    except ValueError:
        return None


class ReadOnlyAdmin(admin.ModelAdmin):
    """No add, no edit: rows change only through the explicit actions."""

    paginator = EstimatedCountPaginator
    show_full_result_count = False  # a second, unfiltered COUNT(*) of the whole table
    list_per_page = 50

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return admin.utils.flatten_fieldsets(self.get_fieldsets(request, obj))

    list_deferred: list[str] = []

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        queryset = super().get_queryset(request)
        match = request.resolver_match
        if self.list_deferred and match is not None and match.url_name.endswith("_changelist"):
            queryset = queryset.defer(*self.list_deferred)
        return queryset

    def dashboard_link(self) -> str:
        return reverse(f"{self.admin_site.name}:django_jobs_dashboard")

    def changelist_view(
        self, request: HttpRequest, extra_context: dict | None = None
    ) -> HttpResponse:
        # django-admin-rangefilter puts request.csp_nonce (django-csp's name) on its inline
        # style and script; Django's own CSP middleware keeps the nonce as _csp_nonce.
        # Hand it over, or a strict Content-Security-Policy blocks the date-range filters.
        nonce = getattr(request, "_csp_nonce", None)
        if nonce is not None and not hasattr(request, "csp_nonce"):
            request.csp_nonce = nonce
        extra = {"django_jobs_dashboard_url": self.dashboard_link(), **(extra_context or {})}
        return super().changelist_view(request, extra_context=extra)


# ---- filters ------------------------------------------------------------------


class ReplayedFilter(admin.SimpleListFilter):
    title = _("replayed")
    parameter_name = "replayed"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("no", _("Not replayed")), ("yes", _("Replayed"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "no":
            return queryset.filter(replayed_at__isnull=True)
        if self.value() == "yes":
            return queryset.filter(replayed_at__isnull=False)
        return queryset


class StateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(JobState.choices)

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value == JobState.WAITING:
            return queryset.waiting()
        if value == JobState.SCHEDULED:
            return queryset.scheduled()
        if value == JobState.RUNNING:
            return queryset.running()
        return queryset


# ---- dead letters --------------------------------------------------------------


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdmin):
    list_display = [
        "short_id", "name", "queue", "reason", "attempts", "dead_at", "enqueued_at",
        "error_line", "replayed",
    ]  # fmt: skip
    list_display_links = ["short_id"]
    list_filter = [
        "reason",
        ReplayedFilter,
        ("dead_at", DateTimeRangeFilter),
        ("enqueued_at", DateTimeRangeFilter),
        "name",
        "queue",
    ]
    # get_search_results below decides how each is matched (ids and keys exactly).
    search_fields = ["id", "key", "name", "error"]
    search_help_text = _("A job id or key (exact), or words of the name or the error.")
    date_hierarchy = "dead_at"
    ordering = ["-dead_at", "-id"]
    actions = ["replay_selected"]
    # The list needs none of these, and each can be many kilobytes per row.
    list_deferred = ["payload", "traceback", "errors"]
    fieldsets = [
        (None, {"fields": [
            "id", "name", "queue", "priority", "key", "reason", "attempts_of",
            "enqueued_at", "started_at", "dead_at",
        ]}),
        (_("Payload"), {"fields": ["payload_json"]}),
        (_("Error"), {"fields": ["error", "traceback_pre", "attempt_table"]}),
        (_("Replay"), {"fields": ["replay_status"]}),
    ]  # fmt: skip

    # -- columns and fields

    @admin.display(description=_("id"), ordering="id")
    def short_id(self, obj: DeadLetter) -> str:
        return str(obj.id)[-12:]

    @admin.display(description=_("error"))
    def error_line(self, obj: DeadLetter) -> str:
        line = (obj.error or "").splitlines()[0] if obj.error else ""
        return line if len(line) <= 90 else line[:89] + "…"

    @admin.display(description=_("replayed"), boolean=True, ordering="replayed_at")
    def replayed(self, obj: DeadLetter) -> bool:
        return obj.replayed_at is not None

    @admin.display(description=_("attempts"))
    def attempts_of(self, obj: DeadLetter) -> str:
        return f"{obj.attempts} / {obj.max_attempts}"

    @admin.display(description=_("payload"))
    def payload_json(self, obj: DeadLetter) -> SafeString:
        return pretty_payload(obj.payload)

    @admin.display(description=_("traceback"))
    def traceback_pre(self, obj: DeadLetter) -> SafeString | str:
        return format_html("<pre>{}</pre>", obj.traceback) if obj.traceback else EMPTY

    @admin.display(description=_("every attempt"))
    def attempt_table(self, obj: DeadLetter) -> SafeString | str:
        return attempt_history(obj.errors)

    @admin.display(description=_("replay"))
    def replay_status(self, obj: DeadLetter) -> SafeString | str:
        if obj.replayed_at is None:
            return _("Not replayed.")
        return format_html(
            "{} {} {} {}. {}",
            _("Replayed at"),
            timezone.localtime(obj.replayed_at).strftime("%Y-%m-%d %H:%M:%S"),
            _("by"),
            obj.replayed_by or EMPTY,
            self._replay_target(obj),
        )

    def _replay_target(self, obj: DeadLetter) -> SafeString:
        """Link the job the replay made: live, finished (its marker) or dead again."""
        job_id = obj.replay_job_id
        site = self.admin_site.name
        if Job.objects.filter(id=job_id).exists():
            url = reverse(f"{site}:django_jobs_job_change", args=[job_id])
            return format_html(
                '{} <a href="{}">{}</a> {}', _("New job"), url, job_id, _("is live.")
            )
        marker = CompletionMarker.objects.filter(job_id=job_id).first()
        if marker is not None:
            url = reverse(f"{site}:django_jobs_completionmarker_change", args=[marker.pk])
            return format_html(
                '{} {} {} <a href="{}">{}</a>.', _("New job"), job_id, _("completed:"), url,
                _("its completion marker"),
            )  # fmt: skip
        if DeadLetter.objects.filter(id=job_id).exists():
            url = reverse(f"{site}:django_jobs_deadletter_change", args=[job_id])
            return format_html(
                '{} {} {} <a href="{}">{}</a>.', _("New job"), job_id, _("died again:"), url,
                _("its dead letter"),
            )  # fmt: skip
        return format_html("{} {} {}", _("New job"), job_id, _("is gone (its marker was pruned)."))

    # -- search

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        job_id = _uuid(term)
        if job_id is not None:
            # The letter of that job, or the letter that was replayed as that job.
            return queryset.filter(Q(id=job_id) | Q(replay_job_id=job_id)), False
        return queryset.filter(
            Q(key=term) | Q(name__icontains=term) | Q(error__icontains=term)
        ), False

    # -- replay

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.replay_deadletter")

    @admin.action(permissions=["replay"], description=_("Replay selected dead letters"))
    def replay_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        # The change list's own queryset (filters, search, "select all"): no id list to build.
        report = queryset.replay(by=_username(request))
        self._after_replay(request, report)

    def _after_replay(self, request: HttpRequest, report: ReplayReport) -> None:
        replayed = list(report.replayed)
        for start in range(0, len(replayed), 500):
            letters = DeadLetter.objects.filter(id__in=replayed[start : start + 500]).only(
                "id", "name", "reason", "replay_job_id"
            )
            entries = [(x.pk, str(x), f"Replayed as job {x.replay_job_id}.") for x in letters]
            _log(request, DeadLetter, entries, CHANGE)
        complete = len(report.replayed) == report.total and report.total > 0
        self.message_user(request, f"{report}.", messages.SUCCESS if complete else messages.WARNING)

    def get_urls(self) -> list[Any]:
        replay = self.admin_site.admin_view(self.replay_view)
        return [
            path("<path:object_id>/replay/", replay, name="django_jobs_deadletter_replay"),
            *super().get_urls(),
        ]

    def replay_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The detail page's Replay button (POST, with an optional run-at)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_replay_permission(request):
            raise PermissionDenied
        letter = self.get_object(request, unquote(object_id))
        if letter is None:
            self.message_user(
                request,
                _("Not replayed: there is no dead letter %s.") % object_id,
                messages.WARNING,
            )
            return HttpResponseRedirect(
                reverse(f"{self.admin_site.name}:django_jobs_deadletter_changelist")
            )
        change_url = reverse(
            f"{self.admin_site.name}:django_jobs_deadletter_change", args=[letter.pk]
        )
        run_at: datetime | None = None
        if request.POST.get("run_at"):
            run_at = parse_datetime(request.POST["run_at"])
            if run_at is None:
                self.message_user(
                    request, _("Not replayed: the run-at time is not a date and time."),
                    messages.ERROR,
                )  # fmt: skip
                return HttpResponseRedirect(change_url)
            if timezone.is_naive(run_at):
                run_at = timezone.make_aware(run_at)
        report = DeadLetter.objects.filter(pk=letter.pk).replay(
            by=_username(request), run_at=run_at
        )
        self._after_replay(request, report)
        return HttpResponseRedirect(change_url)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict | None = None,
    ) -> HttpResponse:
        extra = dict(extra_context or {})
        if self.has_replay_permission(request):
            letter = self.get_object(request, unquote(object_id))
            if letter is not None and letter.replayed_at is None:
                extra["replay_url"] = reverse(
                    f"{self.admin_site.name}:django_jobs_deadletter_replay", args=[letter.pk]
                )
        return super().change_view(request, object_id, form_url, extra_context=extra)


# ---- live jobs -----------------------------------------------------------------


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = [
        "short_id", "name", "queue", "state_label", "priority", "attempts_of", "run_at",
        "lease_holder", "lease_expires_at",
    ]  # fmt: skip
    list_display_links = ["short_id"]
    list_filter = [StateFilter, "queue", "name"]
    search_fields = ["id", "key", "name"]
    search_help_text = _("A job id or key (exact), or words of the name.")
    actions = ["run_now", "cancel"]
    list_deferred = ["payload", "errors"]
    fieldsets = [
        (None, {"fields": [
            "id", "name", "queue", "state_label", "priority", "key", "attempts_of",
            "run_at", "enqueued_at", "started_at", "attempted_at",
        ]}),
        (_("Lease"), {"fields": ["lease_holder", "locked_by", "lease_expires_at"]}),
        (_("Payload"), {"fields": ["payload_json"]}),
        (_("Earlier attempts"), {"fields": ["attempt_table"]}),
    ]  # fmt: skip

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).with_state()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # cancel instead: the job stays inspectable and replayable

    # -- columns and fields

    @admin.display(description=_("id"), ordering="id")
    def short_id(self, obj: Job) -> str:
        return str(obj.id)[-12:]

    @admin.display(description=_("state"), ordering="state")
    def state_label(self, obj: Job) -> str:
        state = getattr(obj, "state", None)
        label = str(JobState(state).label) if state else EMPTY
        if (
            state == JobState.RUNNING
            and obj.lease_expires_at
            and obj.lease_expires_at < timezone.now()
        ):
            return f"{label} ({_('lease expired: rescue is due')})"
        return label

    @admin.display(description=_("attempts"))
    def attempts_of(self, obj: Job) -> str:
        return f"{obj.attempts} / {obj.max_attempts}"

    @admin.display(description=_("lease holder"))
    def lease_holder(self, obj: Job) -> str:
        return obj.locked_by.rpartition("#")[0] if obj.locked_by else EMPTY

    @admin.display(description=_("payload"))
    def payload_json(self, obj: Job) -> SafeString:
        return pretty_payload(obj.payload)

    @admin.display(description=_("errors"))
    def attempt_table(self, obj: Job) -> SafeString | str:
        return attempt_history(obj.errors)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        job_id = _uuid(term)
        if job_id is not None:
            return queryset.filter(id=job_id), False
        return queryset.filter(Q(key=term) | Q(name__icontains=term)), False

    # -- actions

    def has_run_now_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.run_job_now")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.cancel_job")

    @admin.action(permissions=["run_now"], description=_("Run selected scheduled jobs now"))
    def run_now(self, request: HttpRequest, queryset: QuerySet) -> None:
        selected = queryset.count()
        scheduled = list(queryset.scheduled().values_list("id", "name"))
        moved = queryset.run_now()
        if moved:
            entries = [(pk, f"{name} {pk}", "Made due now.") for pk, name in scheduled]
            _log(request, Job, entries, CHANGE)
        message = f"{moved} made due now"
        if selected > moved:
            message += f"; {selected - moved} not scheduled (already due or running), left alone"
        level = messages.SUCCESS if moved == selected else messages.WARNING
        self.message_user(request, f"{message}.", level)

    @admin.action(
        permissions=["cancel"],
        description=_("Cancel selected waiting jobs (move them to the dead letters)"),
    )
    def cancel(self, request: HttpRequest, queryset: QuerySet) -> None:
        names = dict(queryset.values_list("id", "name"))
        report = queryset.cancel(by=_username(request))
        if request.POST.get("select_across") != "1":
            # Ticked on the page but finished before the click: no longer in the queryset.
            ticked = {_uuid(v) for v in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)}
            report.gone += sorted(pk for pk in ticked - set(names) if pk is not None)
        if report.cancelled:
            _log(
                request, DeadLetter,
                ((pk, f"{names[pk]} {pk} (cancelled)", "Cancelled: moved from the live jobs.")
                 for pk in report.cancelled),
                CHANGE,
            )  # fmt: skip
        message = (
            f"{len(report.cancelled)} cancelled "
            "(moved to the dead letters, where they can be replayed)"
        )
        level = messages.SUCCESS
        if report.running:
            level = messages.WARNING
            message += (
                f"; {len(report.running)} running, not cancelled: a job a worker holds cannot be "
                "cancelled here. It ends by itself (done, retried or dead-lettered)"
            )
        if report.gone:
            level = messages.WARNING
            message += f"; {len(report.gone)} no longer live (finished meanwhile)"
        self.message_user(request, f"{message}.", level)

    # -- dashboard

    def get_urls(self) -> list[Any]:
        view = self.admin_site.admin_view(self.dashboard_view)
        return [path("dashboard/", view, name="django_jobs_dashboard"), *super().get_urls()]

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        """The queue dashboard, for staff with any django_jobs permission."""
        if not request.user.has_module_perms(self.opts.app_label):
            raise PermissionDenied
        snap = dashboard.snapshot()
        context = {
            **self.admin_site.each_context(request),
            "title": _("Jobs dashboard"),
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "snap": snap,
            "queues": [(row, dashboard.duration(row.oldest_age)) for row in snap.queues],
            "completed_chart": dashboard.bar_chart(
                snap.completed, start=snap.start, title=str(_("Completions per minute")),
                unit=str(_("completed")), color="#417690",
            ),
            "dead_chart": dashboard.bar_chart(
                snap.dead, start=snap.start, title=str(_("Dead letters per minute")),
                unit=str(_("dead-lettered")), color="#ba2121",
            ),
            "deadletter_url": reverse(f"{self.admin_site.name}:django_jobs_deadletter_changelist"),
            "job_url": reverse(f"{self.admin_site.name}:django_jobs_job_changelist"),
        }  # fmt: skip
        return TemplateResponse(request, "admin/django_jobs/dashboard.html", context)


# ---- completion markers -----------------------------------------------------------


@admin.register(CompletionMarker)
class CompletionMarkerAdmin(ReadOnlyAdmin):
    list_display = ["key", "name", "queue", "attempts", "completed_at", "worker_id"]
    list_filter = [("completed_at", DateTimeRangeFilter)]
    search_fields = ["key", "job_id"]
    search_help_text = _("A key or a job id (exact).")
    ordering = ["-completed_at", "-job_id"]
    list_deferred = ["result"]
    fieldsets = [
        (None, {"fields": [
            "key", "job_id", "name", "queue", "attempts", "enqueued_at", "started_at",
            "completed_at", "worker_id", "replayed_from",
        ]}),
        (_("Result"), {"fields": ["result_json"]}),
    ]  # fmt: skip

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a marker is what keeps its key from running twice

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        # Exact matches only: both are indexed, and a LIKE over a million keys is not.
        term = search_term.strip()
        if not term:
            return queryset, False
        job_id = _uuid(term)
        if job_id is not None:
            return queryset.filter(Q(job_id=job_id) | Q(key=term)), False
        return queryset.filter(key=term), False

    @admin.display(description=_("result"))
    def result_json(self, obj: CompletionMarker) -> SafeString | str:
        if obj.result is None:
            return EMPTY
        shown = json.dumps(payloads.mask(obj.result), indent=2, ensure_ascii=False)
        return format_html('<pre class="django-jobs-json">{}</pre>', shown)

    @admin.display(description=_("replayed from"))
    def replayed_from(self, obj: CompletionMarker) -> SafeString | str:
        letter = DeadLetter.objects.filter(replay_job_id=obj.job_id).only("id").first()
        if letter is None:
            return EMPTY
        url = reverse(f"{self.admin_site.name}:django_jobs_deadletter_change", args=[letter.pk])
        return format_html('<a href="{}">{} {}</a>', url, _("dead letter"), letter.pk)
