"""The completion-marker admin: what ran, read-only (a marker keeps its key from running twice)."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin
from django.db.models import Q
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from rangefilter.filters import DateRangeFilter

from django_jobs.admin.base import IdOrTermSearch, NameQueueColumns, ReadOnlyAdmin
from django_jobs.admin.databases import keep
from django_jobs.admin.display import EMPTY, cell, pretty_json, when_column, when_field
from django_jobs.models import CompletionMarker, DeadLetter


@admin.register(CompletionMarker)
class CompletionMarkerAdmin(IdOrTermSearch, NameQueueColumns, ReadOnlyAdmin):
    list_display = [
        "key_cell",
        "name_cell",
        "queue_cell",
        "attempts",
        "completed_at_cell",
        "worker_cell",
    ]
    list_filter = [("completed_at", DateRangeFilter)]
    search_fields = ["key", "job_id"]
    search_help_text = _("A key or a job id (exact).")
    ordering = ["-completed_at", "-job_id"]
    list_deferred = ["result"]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "key",
                    "job_id",
                    "name",
                    "queue",
                    "attempts",
                    "enqueued_at_time",
                    "started_at_time",
                    "completed_at_time",
                    "worker_id",
                    "replayed_from",
                ]
            },
        ),
        (_("Result"), {"fields": ["result_json"]}),
    ]

    enqueued_at_time = when_field(CompletionMarker, "enqueued_at")
    started_at_time = when_field(CompletionMarker, "started_at")
    completed_at_time = when_field(CompletionMarker, "completed_at")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a marker is what keeps its key from running twice

    # Exact matches only: both are indexed, and a LIKE over a million keys is not.
    def search_id(self, job_id: uuid.UUID, term: str) -> Q:
        return Q(job_id=job_id) | Q(key=term)

    @admin.display(description=_("key"), ordering="key")
    def key_cell(self, obj: CompletionMarker) -> SafeString | str:
        return cell(obj.key, 64, name=True)

    completed_at_cell = when_column("completed_at", _("completed at"))

    @admin.display(description=_("worker"), ordering="worker_id")
    def worker_cell(self, obj: CompletionMarker) -> SafeString | str:
        return cell(obj.worker_id, 48, name=True)

    @admin.display(description=_("result"))
    def result_json(self, obj: CompletionMarker) -> SafeString | str:
        return pretty_json(obj.result)

    @admin.display(description=_("replayed from"))
    def replayed_from(self, obj: CompletionMarker) -> SafeString | str:
        alias = obj._state.db or DeadLetter.objects.db  # a replay's job is its letter's db's
        letters = DeadLetter.objects.using(alias)
        letter = letters.filter(replay_job_id=obj.job_id).only("id").first()
        if letter is None:
            return EMPTY
        url = reverse(f"{self.admin_site.name}:django_jobs_deadletter_change", args=[letter.pk])
        url = keep(url, alias)
        return format_html('<a href="{}">{} {}</a>', url, _("dead letter"), letter.pk)
