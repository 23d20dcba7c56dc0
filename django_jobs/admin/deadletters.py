"""The dead-letter admin: inspect a letter, replay it (selected, or one with a run-at)."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Count, F, Q, QuerySet
from django.db.models.functions import Substr
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext
from rangefilter.filters import DateRangeFilter

from django_jobs import control, limits, registry
from django_jobs.admin.base import IdOrTermSearch, ReadOnlyAdmin, log_changes
from django_jobs.admin.databases import chosen, keep
from django_jobs.admin.display import (
    EMPTY,
    TITLE_LIMIT,
    attempt_history,
    bounded_pre,
    cell,
    pretty_payload,
    showable,
    when,
    when_column,
    when_field,
)
from django_jobs.admin.tags import MetaFilter, TagFilter
from django_jobs.admin.workflows import WorkflowFields, parents_list, parents_of
from django_jobs.models import CompletionMarker, DeadLetter, DeadLetterQuerySet, DeadReason, Job
from django_jobs.rows import ReplayReport

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise


class ReplayedFilter(admin.SimpleListFilter):
    title = _("replayed")
    parameter_name = "replayed"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, StrOrPromise]]:
        return [("no", _("Not replayed")), ("yes", _("Replayed"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "no":
            return queryset.filter(replayed_at__isnull=True)
        if self.value() == "yes":
            return queryset.filter(replayed_at__isnull=False)
        return queryset


@admin.register(DeadLetter)
class DeadLetterAdmin(IdOrTermSearch, WorkflowFields, ReadOnlyAdmin):
    # Fits 1280 px with the sidebar open: the name links the letter, short times, a cut
    # error. The id (searchable), queue, enqueued-at and attempts are on the detail page.
    list_display = ["name_cell", "reason", "dead_at_cell", "error_line", "replayed"]
    list_display_links = ["name_cell"]
    list_filter = [
        "reason",
        ReplayedFilter,
        TagFilter,
        MetaFilter,
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
        (
            _("Job"),
            {
                "fields": [
                    ("name", "queue", "priority"),
                    ("id", "key"),
                    ("enqueued_at_time", "started_at_time", "dead_at_time"),
                ]
            },
        ),
        (_("Payload"), {"fields": ["payload_json"]}),
        (_("Error"), {"fields": ["error_pre", "traceback_pre", "attempt_table"]}),
    ]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        # Right after the job's own facts: for a blocked job, what it waits for is the news.
        first, *rest = self.fieldsets
        return [first, *self.workflow_fieldset(obj), *rest]

    # -- columns and fields

    @admin.display(description=_("name"), ordering="name")
    def name_cell(self, obj: DeadLetter) -> SafeString | str:
        return cell(obj.name, 64, name=True)

    dead_at_cell = when_column("dead_at", _("dead at"))
    # The page's times as the lists show them: never a 500 for a hand-written extreme.
    enqueued_at_time = when_field(DeadLetter, "enqueued_at")
    started_at_time = when_field(DeadLetter, "started_at")
    dead_at_time = when_field(DeadLetter, "dead_at")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        head = Substr("error", 1, TITLE_LIMIT)
        queryset: QuerySet[Any] = super().get_queryset(request).annotate(error_head=head)
        return queryset

    @admin.display(description=_("error"))
    def error_line(self, obj: DeadLetter) -> SafeString | str:
        # Breakable after dots: "django_jobs.exceptions.FatalError" wraps whole, not "FatalE|rror".
        return cell(obj.error_head, 90, name=True)  # type: ignore[attr-defined]  # get_queryset's

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
        """Link the job the replay made: live, finished (its marker) or dead again.

        A replay writes its job on the letter's database: that is where it is looked for.
        """
        job_id: Any = obj.replay_job_id  # None (a replay that made no job) matches no row
        site = self.admin_site.name
        alias = obj._state.db or DeadLetter.objects.db
        if Job.objects.using(alias).filter(id=job_id).exists():
            url = keep(reverse(f"{site}:django_jobs_job_change", args=[job_id]), alias)
            return format_html(
                '{} <a href="{}">{}</a> {}', _("New job"), url, job_id, _("is live.")
            )
        marker = CompletionMarker.objects.using(alias).filter(job_id=job_id).first()
        if marker is not None:
            url = reverse(f"{site}:django_jobs_completionmarker_change", args=[marker.pk])
            url = keep(url, alias)
            return format_html(
                '{} {} {} <a href="{}">{}</a>.',
                _("New job"),
                job_id,
                _("completed:"),
                url,
                _("its completion marker"),
            )
        if DeadLetter.objects.using(alias).filter(id=job_id).exists():
            url = keep(reverse(f"{site}:django_jobs_deadletter_change", args=[job_id]), alias)
            return format_html(
                '{} {} {} <a href="{}">{}</a>.',
                _("New job"),
                job_id,
                _("died again:"),
                url,
                _("its dead letter"),
            )
        return format_html("{} {} {}", _("New job"), job_id, _("is gone (its marker was pruned)."))

    def _why_not_replayable(self, obj: DeadLetter) -> StrOrPromise | None:
        """Say why a replay of this (unreplayed) letter would make no job, or None."""
        if registry.lookup(obj.name) is None:
            return _(
                "No handler is registered under this name in the code this site runs, so a "
                "replay would make no job. Deploy code that registers it, then replay."
            )
        if obj.key is not None:
            alias = obj._state.db or DeadLetter.objects.db  # where its replay would be written
            if CompletionMarker.objects.using(alias).filter(key=obj.key).exists():
                return _("The work of its key has completed since: a replay would make no job.")
            if Job.objects.using(alias).filter(key=obj.key).exists():
                return _("A live job holds its key: replay it once that job has finished.")
        return None

    # -- delete

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        # A pending letter that jobs wait for is their parent's only record: deleted,
        # nothing could ever release them. Django shows "protected" and deletes nothing.
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        return deleted, counts, perms_needed, [*protected, *self._waited_for_lines(objs)]

    def _waited_for_lines(self, objs: Any) -> list[SafeString]:
        """Say, for at most WAITED_FOR_LINES of these letters, what waits for each."""
        if isinstance(objs, QuerySet):  # the delete action's selection, maybe "select all"
            letters = cast(DeadLetterQuerySet, objs)
        else:  # the delete view's [obj]
            alias = objs[0]._state.db if objs else None
            letters = DeadLetter.objects.using(alias or DeadLetter.objects.db).filter(
                pk__in=[letter.pk for letter in objs]
            )
        # The letters deleted together do not count: those of waiting jobs go with their parent.
        # The stubs know no annotation: values_list of one ignores [misc].
        waited = letters.waited_for(besides=letters).order_by(
            (F("waiting") + F("waiting_letters")).desc(), "-dead_at", "-id"
        )
        rows = list(
            waited.values_list("id", "name", "waiting", "waiting_letters")[  # type: ignore[misc]
                : WAITED_FOR_LINES + 1
            ]
        )
        site = self.admin_site.name
        lines = [
            format_html(
                '{}: <a href="{}">{} {}</a>: {}',
                _("Dead letter"),
                keep(
                    reverse(f"{site}:django_jobs_deadletter_change", args=[letter_id]), letters.db
                ),
                cell(name, 120),
                letter_id,
                " ".join(_what_waits(jobs, dead)),
            )
            for letter_id, name, jobs, dead in rows[:WAITED_FOR_LINES]
        ]
        if len(rows) > WAITED_FOR_LINES:  # only then count them all
            more = waited.count() - WAITED_FOR_LINES
            lines.append(
                format_html(
                    "{}",
                    ngettext(
                        "… and %(count)d more dead letter that jobs wait for.",
                        "… and %(count)d more dead letters that jobs wait for.",
                        more,
                    )
                    % {"count": more},
                )
            )
        return lines

    # -- search

    def search_id(self, job_id: uuid.UUID, term: str) -> Q:
        # The letter of that job, or the letter that was replayed as that job.
        return Q(id=job_id) | Q(replay_job_id=job_id)

    def search_term(self, term: str) -> Q:
        return Q(key=term) | Q(name__icontains=term) | Q(error__icontains=term)

    # -- replay

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.replay_deadletter")

    @admin.action(permissions=["replay"], description=_("Replay selected dead letters"))
    def replay_selected(
        self, request: HttpRequest, queryset: DeadLetterQuerySet
    ) -> HttpResponse | None:
        # The change list's own queryset (filters, search, "select all"): no id list to build.
        if request.POST.get("post") != "yes":
            return self._replay_confirmation(request, queryset)
        report = control.replay(queryset, by=request.user.get_username())
        self._after_replay(request, report, queryset.db)
        return None

    def _replay_confirmation(
        self, request: HttpRequest, queryset: DeadLetterQuerySet
    ) -> HttpResponse:
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
            ],
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

    def _after_replay(self, request: HttpRequest, report: ReplayReport, alias: str) -> None:
        # A LogEntry per replayed letter (of database alias), LOG_BATCH letters per read
        # and per INSERT.
        replayed = list(report.replayed)
        letters_of = DeadLetter.objects.using(alias)
        for start in range(0, len(replayed), LOG_BATCH):
            part = replayed[start : start + LOG_BATCH]
            letters = letters_of.filter(id__in=part).only("id", "name", "reason")
            entries = [(x.pk, str(x), f"Replayed as job {report.replayed[x.pk]}.") for x in letters]
            log_changes(request, DeadLetter, entries, CHANGE)
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
                keep(
                    reverse(f"{self.admin_site.name}:django_jobs_deadletter_changelist"),
                    chosen(request),
                )
            )
        alias = letter._state.db or DeadLetter.objects.db
        change_url = keep(
            reverse(f"{self.admin_site.name}:django_jobs_deadletter_change", args=[letter.pk]),
            alias,
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
            try:
                limits.run_time(str(_("the run-at time")), run_at)
            except ValueError as exc:
                self.message_user(
                    request, _("Not replayed: %(why)s.") % {"why": exc}, messages.ERROR
                )
                return HttpResponseRedirect(change_url)
        report = control.replay(
            DeadLetter.objects.using(alias).filter(pk=letter.pk),
            by=request.user.get_username(),
            run_at=run_at,
        )
        self._after_replay(request, report, alias)
        return HttpResponseRedirect(change_url)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
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
            if letter.reason == DeadReason.PARENT_DEAD:
                # Which parent died (and where it is now): the cause to put right first.
                alias = letter._state.db or DeadLetter.objects.db
                edges = parents_of([letter.pk], alias).get(letter.pk, [])
                extra["summary"]["parents"] = parents_list(self.admin_site.name, edges, alias)
            if letter.replayed_at is None and self.has_replay_permission(request):
                blocked = self._why_not_replayable(letter)
                if blocked:
                    extra["replay_blocked"] = blocked
                else:
                    extra["replay_url"] = keep(
                        reverse(
                            f"{self.admin_site.name}:django_jobs_deadletter_replay",
                            args=[letter.pk],
                        ),
                        letter._state.db,
                    )
        return super().change_view(request, object_id, form_url, extra_context=extra)


def _what_waits(jobs: int, letters: int) -> list[str]:
    """The sentences of a refused delete's line: the jobs, then the letters, that wait."""
    said = []
    if jobs:
        said.append(
            ngettext(
                "%(count)d job waits for it (its page lists it). Replay it, or cancel "
                "that job first (the jobs admin's cancel action, or manage.py jobs "
                "cancel JOB_ID).",
                "%(count)d jobs wait for it (its page lists them). Replay it, or cancel "
                "those jobs first (the jobs admin's cancel action, or manage.py jobs "
                "cancel JOB_ID).",
                jobs,
            )
            % {"count": jobs}
        )
    if letters:
        said.append(
            ngettext(
                "%(count)d dead letter of a job that waited for it would wait again if "
                "replayed: delete that letter with this one, or replay this one first.",
                "%(count)d dead letters of jobs that waited for it would wait again if "
                "replayed: delete those letters with this one, or replay this one first.",
                letters,
            )
            % {"count": letters}
        )
    return said


# Replayed letters per read and per INSERT of their LogEntry rows.
LOG_BATCH = 1000

# The letters a refused delete names, the first ones by how many jobs wait for each.
WAITED_FOR_LINES = 20

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
