"""The operators' admin: dead letters to inspect and replay, live jobs, markers, a dashboard.

Everything here is read-only. The only writes are explicit actions (replay,
delete, run now, cancel), each gated by its own permission, each calling a
named state change of the models, each reported with ``message_user`` and
recorded as a ``LogEntry``. Payloads are shown with the ``MASK_KEYS`` masked.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import unquote
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import DataError, connections
from django.db.models import Count, Model, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Substr
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import conditional_escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _
from rangefilter.filters import DateRangeFilter

from django_jobs import dashboard, payloads, registry
from django_jobs.models import (
    CompletionMarker,
    DeadLetter,
    Job,
    JobState,
    ReplayReport,
    UnknownName,
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


# A detail page shows at most this much of any one text (payload, error, traceback, result):
# a 10 MB error makes a 64 KB page section, not a 21 MB page.
DETAIL_LIMIT = 64 * 1024
# Per attempt in the attempt table, and how many attempts (the latest) it lists.
ATTEMPT_TEXT_LIMIT = 4 * 1024
ATTEMPTS_SHOWN = 50
# A list cell shows one line of at most this many characters; the line (up to a limit) is
# its title.
CELL_LIMIT = 60
TITLE_LIMIT = 1000

# NUL and lone surrogates: storable in JSON text, not in an HTML page encoded as UTF-8.
_UNSHOWABLE = re.compile(r"[\x00\ud800-\udfff]")


def showable(value: Any) -> str:
    """Return str(value) with NUL and lone surrogates as their JSON escapes (\\u0000)."""
    return _UNSHOWABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", str(value))


def bounded_pre(value: Any, limit: int = DETAIL_LIMIT, css: str = "") -> SafeString:
    """Return text in a <pre>, at most limit characters of it, saying so when cut."""
    text = value if isinstance(value, str) else str(value)
    attrs = format_html(' class="{}"', css) if css else ""
    shown = format_html("<pre{}>{}</pre>", attrs, showable(text[:limit]))
    if len(text) <= limit:
        return shown
    note = _("Cut: the first %(shown)s of %(total)s characters are shown.") % {
        "shown": f"{limit:,}",
        "total": f"{len(text):,}",
    }
    return format_html('{}<p class="help django-jobs-cut">{}</p>', shown, note)


def cell(value: Any, limit: int = CELL_LIMIT, *, name: bool = False) -> SafeString | str:
    """Return a list cell: the first line, cut to limit characters, the line as its title.

    A name (dotted path, queue, worker id) may wrap after its dots, dashes and colons.
    """
    if value is None or value == "":
        return EMPTY
    text = value if isinstance(value, str) else str(value)
    line = text[:TITLE_LIMIT].split("\n", 1)[0].strip()
    short = line if len(line) <= limit else line[: limit - 1] + "…"
    shown = conditional_escape(showable(short))
    if name:  # escaping leaves . _ - : / alone, so a <wbr> never lands inside an entity
        shown = mark_safe(_BREAK_AFTER.sub(r"\1<wbr>", shown))  # noqa: S308 - escaped above
    if len(line) == len(text) and short == line:
        return shown
    title = showable(line if len(line) < TITLE_LIMIT else line + "…")
    return format_html('<span title="{}">{}</span>', title, shown)


_BREAK_AFTER = re.compile(r"([._\-:/])")


def json_text(value: Any) -> str:
    """Return a decoded JSON value as indented text with the MASK_KEYS masked."""
    return json.dumps(payloads.mask(value), indent=2, ensure_ascii=False, default=str)


def pretty_payload(text: Any) -> SafeString:
    """Return a payload as indented JSON with the MASK_KEYS masked, in a <pre>."""
    try:
        shown = json_text(payloads.decode(text))
    except (ValueError, TypeError, RecursionError):
        return format_html(
            '<p class="errornote">{}</p>{}',
            _("Not valid JSON (shown as stored):"),
            bounded_pre(text, css="django-jobs-json"),
        )
    return bounded_pre(shown, css="django-jobs-json")


def pretty_json(value: Any) -> SafeString | str:
    """Return a decoded JSON field (a result, worker stats) like a payload."""
    if value is None:
        return EMPTY
    try:
        shown = json_text(value)
    except (ValueError, TypeError, RecursionError):
        shown = str(value)
    return bounded_pre(shown, css="django-jobs-json")


def attempt_history(errors: Any) -> SafeString | str:
    """Return every attempt's error as a table, tracebacks folded (no script needed)."""
    if not errors:
        return EMPTY
    if not isinstance(errors, list):  # a hand-edited row: show what is there
        return format_html(
            '<p class="errornote">{}</p>{}',
            _("Not a list of attempts (shown as stored):"),
            pretty_json(errors),
        )
    hidden = max(0, len(errors) - ATTEMPTS_SHOWN)
    rows = format_html_join(
        "", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        (_attempt_row(error) for error in errors[hidden:]),
    )  # fmt: skip
    table = format_html(
        '<table class="django-jobs-attempts"><thead><tr><th>{}</th><th>{}</th><th>{}</th>'
        "<th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>",
        _("attempt"), _("at"), _("worker"), _("error"), _("traceback"), rows,
    )  # fmt: skip
    if not hidden:
        return table
    note = _("The first %(hidden)s attempts are not shown; the latest %(shown)s are.") % {
        "hidden": hidden,
        "shown": ATTEMPTS_SHOWN,
    }
    return format_html('<p class="help">{}</p>{}', note, table)


def _attempt_row(error: Any) -> tuple[Any, ...]:
    limit = ATTEMPT_TEXT_LIMIT
    if not isinstance(error, dict):
        return ("?", EMPTY, EMPTY, bounded_pre(error, limit), EMPTY)
    traceback = error.get("traceback")
    return (
        showable(error.get("attempt", ""))[:40],
        _format_when(error.get("at")),
        showable(error.get("worker", "") or EMPTY)[:200],
        bounded_pre(error_summary(error) or EMPTY, limit),
        format_html(
            "<details><summary>{}</summary>{}</details>",
            _("traceback"),
            bounded_pre(traceback, 4 * limit),
        )
        if traceback
        else EMPTY,
    )


def _format_when(value: Any) -> str:
    if not isinstance(value, str):
        return EMPTY
    try:
        parsed = parse_datetime(value[:64])
    except ValueError:  # well-formed but impossible, such as 2024-02-30
        parsed = None
    if parsed is None:
        return showable(value[:64])
    return when(parsed)


def list_when(value: datetime | None) -> SafeString | str:
    """Return a time to the minute for a list column, with the seconds in its title."""
    if value is None:
        return EMPTY
    full = when(value)
    return format_html('<span title="{}">{}</span>', full, full[:16])


def when(value: datetime | None) -> str:
    """Return a time in the current time zone, short enough for a list column."""
    if value is None:
        return EMPTY
    if timezone.is_aware(value):
        value = timezone.localtime(value)
    return value.strftime("%Y-%m-%d %H:%M:%S")


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


class GuardedAdmin(admin.ModelAdmin):
    """Answer hostile query strings and object ids with a 400 or Django's "?e=1", never a 500."""

    def changelist_view(
        self, request: HttpRequest, extra_context: dict | None = None
    ) -> HttpResponse:
        if any("\x00" in text for key, values in request.GET.lists() for text in (key, *values)):
            # PostgreSQL refuses NUL in any text it is sent: no row can match it anyway.
            return HttpResponseBadRequest(
                _("A NUL character is not allowed in a filter or a search.")
            )
        # Dashboard link on every change list of ours (the template shows it).
        extra = {"django_jobs_dashboard_url": _dashboard_url(self), **(extra_context or {})}
        return super().changelist_view(request, extra_context=extra)

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        try:
            return super().get_changelist_instance(request)
        except (ValueError, OverflowError, DataError) as exc:
            # Django's own filters raise these on values past the limits of their types
            # (?dead_at__year=9999 asks for the year 10000): answer as Django does for an
            # unknown filter, by a redirect to the unfiltered list with ?e=1.
            raise IncorrectLookupParameters(exc) from exc

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        if "\x00" in object_id:
            return None  # no row has it, and PostgreSQL refuses it in a query
        return super().get_object(request, object_id, from_field)


def _dashboard_url(model_admin: admin.ModelAdmin) -> str | None:
    try:
        return reverse(f"{model_admin.admin_site.name}:django_jobs_dashboard")
    except NoReverseMatch:  # a site without the jobs admin (and so without its dashboard)
        return None


class ReadOnlyAdmin(GuardedAdmin):
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

    def changelist_view(
        self, request: HttpRequest, extra_context: dict | None = None
    ) -> HttpResponse:
        # django-admin-rangefilter puts request.csp_nonce (django-csp's name) on its inline
        # style and script; Django's own CSP middleware keeps the nonce as _csp_nonce.
        # Hand it over, or a strict Content-Security-Policy blocks the date-range filters.
        nonce = getattr(request, "_csp_nonce", None)
        if nonce is not None and not hasattr(request, "csp_nonce"):
            request.csp_nonce = nonce
        return super().changelist_view(request, extra_context=extra_context)


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


UNKNOWN_NAME = "unknown_name"


class StateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [*JobState.choices, (UNKNOWN_NAME, _("waiting: no live worker knows its name"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value == UNKNOWN_NAME:
            return queryset.claimable().filter(unknown_since__isnull=False)
        if value == JobState.WAITING:
            return queryset.waiting()
        if value == JobState.SCHEDULED:
            return queryset.scheduled()
        if value == JobState.RUNNING:
            return queryset.running()
        return queryset


# ---- dead letters --------------------------------------------------------------


class NameQueueColumns:
    """The name and queue columns of the job-like lists, cut to fit at 1280 px."""

    @admin.display(description=_("name"), ordering="name")
    def name_cell(self, obj: Job | CompletionMarker) -> SafeString | str:
        return cell(obj.name, 64, name=True)

    @admin.display(description=_("queue"), ordering="queue")
    def queue_cell(self, obj: Job | CompletionMarker) -> SafeString | str:
        return cell(obj.queue, 32, name=True)


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdmin):
    # Fits 1280 px with the sidebar open: the name links the letter, short times, a cut
    # error. The id (searchable), queue, enqueued-at and attempts are on the detail page.
    list_display = ["name_cell", "reason", "dead_at_cell", "error_line", "replayed"]
    list_display_links = ["name_cell"]
    list_filter = [
        "reason",
        ReplayedFilter,
        # Dates only: a range of days needs no times (the date-time filter refused empty ones).
        ("dead_at", DateRangeFilter),
        ("enqueued_at", DateRangeFilter),
        "name",
        "queue",
    ]
    # get_search_results below decides how each is matched (ids and keys exactly).
    search_fields = ["id", "key", "name", "error"]
    search_help_text = _("A job id or key (exact), or words of the name or the error.")
    date_hierarchy = "dead_at"
    ordering = ["-dead_at", "-id"]
    actions = ["replay_selected"]
    # The list needs none of these, and each can be megabytes per row (the error column
    # reads only its head, see get_queryset).
    list_deferred = ["payload", "traceback", "errors", "error"]
    # The summary at the top of the page (see change_view) says why and what next; these follow.
    fieldsets = [
        (_("Job"), {"fields": [
            ("name", "queue", "priority"), ("id", "key"), ("enqueued_at", "started_at", "dead_at"),
        ]}),
        (_("Payload"), {"fields": ["payload_json"]}),
        (_("Error"), {"fields": ["error_pre", "traceback_pre", "attempt_table"]}),
    ]  # fmt: skip

    # -- columns and fields

    @admin.display(description=_("name"), ordering="name")
    def name_cell(self, obj: DeadLetter) -> SafeString | str:
        return cell(obj.name, 64, name=True)

    @admin.display(description=_("dead at"), ordering="dead_at")
    def dead_at_cell(self, obj: DeadLetter) -> SafeString | str:
        return list_when(obj.dead_at)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).annotate(error_head=Substr("error", 1, TITLE_LIMIT))

    @admin.display(description=_("error"))
    def error_line(self, obj: DeadLetter) -> SafeString | str:
        return cell(obj.error_head, 90)

    @admin.display(description=_("replayed"), ordering="replayed_at")
    def replayed(self, obj: DeadLetter) -> SafeString | str:
        # Neutral marks: not replayed yet is the normal state of a letter, not an error.
        if obj.replayed_at is None:
            return format_html('<span class="django-jobs-quiet" title="{}">–</span>', _("no"))
        title = f"{when(obj.replayed_at)} {_('by')} {obj.replayed_by or EMPTY}"
        return format_html('<span title="{}">✓ {}</span>', showable(title), _("yes"))

    @admin.display(description=_("attempts"))
    def attempts_of(self, obj: DeadLetter) -> str:
        return f"{obj.attempts} / {obj.max_attempts}"

    @admin.display(description=_("payload"))
    def payload_json(self, obj: DeadLetter) -> SafeString:
        return pretty_payload(obj.payload)

    @admin.display(description=_("last error"))
    def error_pre(self, obj: DeadLetter) -> SafeString | str:
        return bounded_pre(obj.error) if obj.error else EMPTY

    @admin.display(description=_("traceback"))
    def traceback_pre(self, obj: DeadLetter) -> SafeString | str:
        return bounded_pre(obj.traceback) if obj.traceback else EMPTY

    @admin.display(description=_("every attempt"))
    def attempt_table(self, obj: DeadLetter) -> SafeString | str:
        return attempt_history(obj.errors)

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

    def _why_not_replayable(self, obj: DeadLetter) -> str | None:
        """Say why a replay of this (unreplayed) letter would make no job, or None."""
        if registry.lookup(obj.name) is None:
            return _(
                "No handler is registered under this name in the code this site runs, so a "
                "replay would make no job. Deploy code that registers it, then replay."
            )
        if obj.key is not None:
            if CompletionMarker.objects.filter(key=obj.key).exists():
                return _("The work of its key has completed since: a replay would make no job.")
            if Job.objects.filter(key=obj.key).exists():
                return _("A live job holds its key: replay it once that job has finished.")
        return None

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
    def replay_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        # The change list's own queryset (filters, search, "select all"): no id list to build.
        if request.POST.get("post") != "yes":
            return self._replay_confirmation(request, queryset)
        report = queryset.replay(by=_username(request))
        self._after_replay(request, report)
        return None

    def _replay_confirmation(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse:
        """Say how many letters of which handlers a replay would make jobs of, as delete does."""
        by_name = list(
            queryset.order_by()
            .values("name")
            .annotate(
                pending=Count("pk", filter=Q(replayed_at__isnull=True)),
                replayed=Count("pk", filter=Q(replayed_at__isnull=False)),
            )
            .order_by("-pending", "name")[:101]
        )
        totals = queryset.aggregate(
            pending=Count("pk", filter=Q(replayed_at__isnull=True)),
            already=Count("pk", filter=Q(replayed_at__isnull=False)),
        )
        unknown = (
            queryset.filter(replayed_at__isnull=True)
            .exclude(name__in=list(registry.all_handlers()))
            .count()
        )
        context = {
            **self.admin_site.each_context(request),
            "title": _("Replay dead letters?"),
            "subtitle": None,
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "names": [
                (
                    cell(row["name"], 120),
                    row["pending"],
                    row["replayed"],
                    registry.lookup(row["name"]) is not None,
                )
                for row in by_name[:100]
            ],  # fmt: skip
            "more_names": len(by_name) > 100,
            "pending": totals["pending"],
            "already": totals["already"],
            "unknown": unknown,
            "replayable": totals["pending"] - unknown,
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across", "0"),
            "index": request.POST.get("index", "0"),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(
            request, "admin/django_jobs/deadletter/replay_confirmation.html", context
        )

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
        # Replaying needs both: the button is on a page that only viewers see.
        if not (self.has_replay_permission(request) and self.has_view_permission(request)):
            raise PermissionDenied
        letter = self.get_object(request, unquote(object_id))
        if letter is None:
            self.message_user(
                request,
                _("Not replayed: there is no dead letter %s.") % showable(object_id)[:100],
                messages.WARNING,
            )
            return HttpResponseRedirect(
                reverse(f"{self.admin_site.name}:django_jobs_deadletter_changelist")
            )
        change_url = reverse(
            f"{self.admin_site.name}:django_jobs_deadletter_change", args=[letter.pk]
        )
        run_at = None
        if request.POST.get("run_at"):
            run_at = _run_at(request.POST["run_at"])
            if run_at is None:
                self.message_user(
                    request,
                    _("Not replayed: the run-at time %(value)s is not a date and time.")
                    % {"value": repr(showable(request.POST["run_at"][:40]))},
                    messages.ERROR,
                )
                return HttpResponseRedirect(change_url)
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
        letter = self.get_object(request, unquote(object_id))
        if letter is not None and self.has_view_permission(request, letter):
            reason = letter.get_reason_display()
            # The title says why in words: "attempts exhausted", not "(attempts_exhausted)".
            extra["subtitle"] = f"{cell(letter.name, 120)} · {reason}"
            extra["summary"] = {
                "reason": reason,
                "attempts": self.attempts_of(letter),
                "dead_at": when(letter.dead_at),
                "error": cell(letter.error, 300),
                "replayed_at": when(letter.replayed_at) if letter.replayed_at else None,
                "replayed_by": letter.replayed_by,
                "target": self._replay_target(letter) if letter.replayed_at else None,
            }
            if letter.replayed_at is None and self.has_replay_permission(request):
                blocked = self._why_not_replayable(letter)
                if blocked:
                    extra["replay_blocked"] = blocked
                else:
                    extra["replay_url"] = reverse(
                        f"{self.admin_site.name}:django_jobs_deadletter_replay", args=[letter.pk]
                    )
        return super().change_view(request, object_id, form_url, extra_context=extra)


_RUN_AT = re.compile(r"[0-9T:.+\- Z]{10,40}")


def _run_at(text: str) -> datetime | None:
    """Parse the Replay form's run-at (local time unless it says otherwise); None if invalid."""
    text = text.strip()
    if not _RUN_AT.fullmatch(text):  # Python's parser takes "2024-01-01T10:00\x00", we don't
        return None
    try:
        value = parse_datetime(text)
        if value is None:
            return None
        if timezone.is_naive(value):
            value = timezone.make_aware(value)
        value.astimezone(UTC)  # a time the database can store (not past year 9999 in UTC)
    except (ValueError, OverflowError):  # 2024-02-30T10:00, 2024-01-01T25:00, ...
        return None
    return value


# ---- live jobs -----------------------------------------------------------------


@admin.register(Job)
class JobAdmin(NameQueueColumns, ReadOnlyAdmin):
    # Fits 1280 px with the sidebar open: the name links the job, the state says the attempt,
    # the lease (holder and time left) is one column.
    list_display = ["name_cell", "queue_cell", "state_label", "run_at_cell", "lease"]
    list_display_links = ["name_cell"]
    list_filter = [StateFilter, "queue", "name"]
    search_fields = ["id", "key", "name"]
    search_help_text = _("A job id or key (exact), or words of the name.")
    actions = ["run_now", "cancel"]
    list_deferred = ["payload", "errors"]
    fieldsets = [
        (None, {"fields": [
            ("name", "queue"), ("id", "key"), ("state_label", "priority", "attempts_of"),
            ("run_at", "enqueued_at"), ("started_at", "attempted_at"),
        ]}),
        (_("Lease"), {"fields": [("lease_holder", "locked_by", "lease_expires_at")]}),
        (_("Payload"), {"fields": ["payload_json"]}),
        (_("Earlier attempts"), {"fields": ["attempt_table"]}),
    ]  # fmt: skip

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # Since when no live worker knows the job's name (a subquery: no query per row).
        unknown = UnknownName.objects.current().filter(name=OuterRef("name")).values("since")
        return (
            super().get_queryset(request).with_state().annotate(unknown_since=Subquery(unknown[:1]))
        )

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # cancel instead: the job stays inspectable and replayable

    # -- columns and fields

    @admin.display(description=_("state"), ordering="state")
    def state_label(self, obj: Job) -> SafeString | str:
        state = getattr(obj, "state", None)
        label = str(JobState(state).label) if state else EMPTY
        expired = (
            state == JobState.RUNNING
            and obj.lease_expires_at
            and obj.lease_expires_at < timezone.now()
        )
        since = getattr(obj, "unknown_since", None)
        if since is not None and (expired or state == JobState.WAITING):
            when = timezone.localtime(since).strftime("%Y-%m-%d %H:%M")
            label = f"{label} ({_('no live worker knows this name since')} {when})"
        elif expired:
            label = f"{label} ({_('lease expired: rescue is due')})"
        if not obj.attempts:
            return label
        attempt = _("attempt %(n)s of %(of)s") % {"n": obj.attempts, "of": obj.max_attempts}
        return format_html('{}<br><span class="django-jobs-quiet">{}</span>', label, attempt)

    @admin.display(description=_("attempts"))
    def attempts_of(self, obj: Job) -> str:
        return f"{obj.attempts} / {obj.max_attempts}"

    @admin.display(description=_("run at"), ordering="run_at")
    def run_at_cell(self, obj: Job) -> SafeString | str:
        return list_when(obj.run_at)

    @admin.display(description=_("lease holder"))
    def lease_holder(self, obj: Job) -> str:
        return showable(obj.locked_by.rpartition("#")[0]) if obj.locked_by else EMPTY

    @admin.display(description=_("lease"), ordering="lease_expires_at")
    def lease(self, obj: Job) -> SafeString | str:
        """The worker holding the job, and how long its lease has left (or since it expired)."""
        if not obj.locked_by or obj.lease_expires_at is None:
            return EMPTY
        left = (obj.lease_expires_at - timezone.now()).total_seconds()
        if left >= 0:
            until = _("%(left)s left") % {"left": dashboard.duration(timedelta(seconds=left))}
        else:
            until = _("expired %(ago)s ago") % {"ago": dashboard.duration(timedelta(seconds=-left))}
        holder = obj.locked_by.rpartition("#")[0]
        return format_html(
            '{}<br><span class="django-jobs-quiet" title="{}">{}</span>',
            cell(holder, 48, name=True), when(obj.lease_expires_at), until,
        )  # fmt: skip

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
class CompletionMarkerAdmin(NameQueueColumns, ReadOnlyAdmin):
    list_display = [
        "key_cell", "name_cell", "queue_cell", "attempts", "completed_at_cell", "worker_cell",
    ]  # fmt: skip
    list_filter = [("completed_at", DateRangeFilter)]
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

    @admin.display(description=_("key"), ordering="key")
    def key_cell(self, obj: CompletionMarker) -> SafeString | str:
        return cell(obj.key, 64, name=True)

    @admin.display(description=_("completed at"), ordering="completed_at")
    def completed_at_cell(self, obj: CompletionMarker) -> SafeString | str:
        return list_when(obj.completed_at)

    @admin.display(description=_("worker"), ordering="worker_id")
    def worker_cell(self, obj: CompletionMarker) -> SafeString | str:
        return cell(obj.worker_id, 48, name=True)

    @admin.display(description=_("result"))
    def result_json(self, obj: CompletionMarker) -> SafeString | str:
        return pretty_json(obj.result)

    @admin.display(description=_("replayed from"))
    def replayed_from(self, obj: CompletionMarker) -> SafeString | str:
        letter = DeadLetter.objects.filter(replay_job_id=obj.job_id).only("id").first()
        if letter is None:
            return EMPTY
        url = reverse(f"{self.admin_site.name}:django_jobs_deadletter_change", args=[letter.pk])
        return format_html('<a href="{}">{} {}</a>', url, _("dead letter"), letter.pk)
