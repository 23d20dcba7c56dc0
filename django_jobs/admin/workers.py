"""The worker admin: the live workers' heartbeats."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_jobs import conf
from django_jobs.admin.base import OperationsAdmin
from django_jobs.admin.display import cell, pretty_json, when_column, when_field
from django_jobs.models import WorkerBeat


@admin.register(WorkerBeat)
class WorkerBeatAdmin(OperationsAdmin):
    list_display = ["host_cell", "pid", "queues_cell", "busy", "started", "last_seen", "live"]
    readonly_fields = [
        "id",
        "host",
        "pid",
        "queues_cell",
        "concurrency",
        "running",
        "started_at_time",
        "last_seen_at_time",
        "stats_json",
    ]
    started_at_time = when_field(WorkerBeat, "started_at")
    last_seen_at_time = when_field(WorkerBeat, "last_seen_at")

    @admin.display(description=_("host"), ordering="host")
    def host_cell(self, obj: WorkerBeat) -> SafeString | str:
        return cell(obj.host, 48, name=True)

    @admin.display(description=_("running / concurrency"))
    def busy(self, obj: WorkerBeat) -> str:
        return f"{obj.running} / {obj.concurrency}"

    started = when_column("started_at", _("started at"))
    last_seen = when_column("last_seen_at", _("last seen"))

    @admin.display(description=_("queues"))
    def queues_cell(self, obj: WorkerBeat) -> SafeString | str:
        queues = obj.queues
        text = ", ".join(map(str, queues)) if isinstance(queues, list) else str(queues)
        return cell(text)

    @admin.display(description=_("stats"))
    def stats_json(self, obj: WorkerBeat) -> SafeString | str:
        return pretty_json(obj.stats)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=_("live"), boolean=True)
    def live(self, obj: WorkerBeat) -> bool:
        return (timezone.now() - obj.last_seen_at).total_seconds() < float(
            conf.get("WORKER_EXPIRY")
        )
