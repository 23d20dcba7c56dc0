"""The queue admin: counts per queue, pause and resume.

The counts of a page's queues come from one grouped count of the live jobs
(``JobQuerySet.counts_by_queue``, as the dashboard's), attached to the page's rows
once they are read: a correlated count per column and row read the jobs table five
times a queue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_jobs import control, limits
from django_jobs.admin.base import OperationsAdmin
from django_jobs.admin.display import cell, list_when
from django_jobs.models import Job, QueueState


def _count(attribute: str, description: Any) -> Callable[[Any, Any], int]:
    """A changelist column of counts that get_changelist_instance sets on each row."""

    @admin.display(description=description)
    def column(self: Any, obj: Any) -> int:
        return int(getattr(obj, attribute))

    return column


@admin.register(QueueState)
class QueueStateAdmin(OperationsAdmin):
    list_display = [
        "name_cell",
        "paused_mark",
        "waiting",
        "scheduled",
        "running",
        "blocked",
        "oldest_wait",
    ]
    list_filter = ["paused"]
    actions = ["pause_queues", "resume_queues"]
    readonly_fields = ["name", "paused", "paused_at", "paused_by", "reason"]

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        changelist: ChangeList = super().get_changelist_instance(request)
        # The page's rows are read here, and the template shows these same instances.
        rows: list[Any] = list(changelist.result_list)
        jobs = Job.objects.using(changelist.result_list.db)
        names = [row.name for row in rows]
        counts = {c["queue"]: c for c in jobs.filter(queue__in=names).counts_by_queue()}
        for row in rows:
            found = counts.get(row.name, {})
            row.n_waiting = found.get("waiting", 0)
            row.n_scheduled = found.get("scheduled", 0)
            row.n_running = found.get("running", 0)
            row.n_blocked = found.get("blocked", 0)
            row.oldest_run_at = found.get("oldest")
        return changelist

    @admin.display(description=_("name"), ordering="name")
    def name_cell(self, obj: QueueState) -> SafeString | str:
        return cell(obj.name, 48, name=True)

    @admin.display(description=_("paused"), ordering="paused")
    def paused_mark(self, obj: QueueState) -> SafeString | str:
        """Neutral when running (the normal case); when paused, by whom, since when and why."""
        if not obj.paused:
            return format_html('<span class="django-jobs-quiet" title="{}">–</span>', _("no"))
        who = obj.paused_by or "—"
        since = list_when(obj.paused_at) if obj.paused_at else "—"
        return format_html(
            '<strong class="django-jobs-paused">{}</strong> {} {}, {}<br>{}',
            _("paused"),
            _("by"),
            cell(who, 40),
            since,
            cell(obj.reason, 80),
        )

    waiting = _count("n_waiting", _("waiting"))
    scheduled = _count("n_scheduled", _("scheduled"))
    running = _count("n_running", _("running"))
    # Workflow steps waiting for their parents: not due, and not counted as scheduled.
    blocked = _count("n_blocked", _("blocked"))

    @admin.display(description=_("oldest wait"))
    def oldest_wait(self, obj: Any) -> str:
        if obj.oldest_run_at is None:
            return "-"
        return limits.format_duration(
            max(0.0, (timezone.now() - obj.oldest_run_at).total_seconds())
        )

    @admin.action(
        description=_("Pause selected queues (running jobs finish)"), permissions=["change"]
    )
    def pause_queues(self, request: HttpRequest, queryset: Any) -> None:
        count = control.pause(
            queryset.values_list("name", flat=True),
            by=request.user.get_username(),
            using=queryset.db,
        )
        self.message_user(
            request,
            f"Paused {count} queue(s): workers stop claiming them within one poll.",
            messages.SUCCESS,
        )

    @admin.action(description=_("Resume selected queues"), permissions=["change"])
    def resume_queues(self, request: HttpRequest, queryset: Any) -> None:
        count = control.resume(queryset.values_list("name", flat=True), using=queryset.db)
        self.message_user(request, f"Resumed {count} queue(s).", messages.SUCCESS)
