"""The queue dashboard: a few indexed, bounded queries and a chart drawn as inline SVG.

Every figure comes from a few queries, none of which counts a whole big table:
the live-job table (small by design) grouped by queue, the last hour of
completion markers and of dead letters along their time indexes, the unreplayed
dead letters grouped by reason, and the live workers' heartbeat rows (a handful),
so that jobs waiting with no worker to run them say so. The chart is SVG markup
with presentation attributes only (no script, no style attribute, no CDN), so it
renders offline and under a strict Content-Security-Policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, QuerySet
from django.db.models.functions import TruncMinute
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from django_jobs import conf, limits, registry, status
from django_jobs.models import CompletionMarker, DeadLetter, DeadReason, Job, WorkerBeat

WINDOW_MINUTES = 60


def may_see(user: Any) -> bool:
    """Say whether user may see the figures: the admin's dashboard and the metrics view.

    One rule for both: an active staff user with any django_jobs permission (a superuser
    has them all). Staff without one see neither; the metrics token is the metrics view's
    other way in.
    """
    return bool(
        user is not None
        and user.is_active
        and user.is_staff
        and user.has_module_perms("django_jobs")
    )


@dataclass
class QueueRow:
    queue: str
    waiting: int = 0
    scheduled: int = 0
    running: int = 0
    blocked: int = 0  # workflow steps waiting for their parents (not due, not scheduled)
    oldest_waiting: datetime | None = None
    now: datetime | None = None
    declared: bool = True  # a handler (or the default) uses it: runjobs serves it by default

    @property
    def oldest_age(self) -> timedelta | None:
        """How long the oldest waiting job has been due."""
        if self.oldest_waiting is None or self.now is None:
            return None
        return max(timedelta(0), self.now - self.oldest_waiting)


@dataclass
class Snapshot:
    now: datetime
    start: datetime  # the first minute of the chart
    queues: list[QueueRow] = field(default_factory=list)
    completed: list[int] = field(default_factory=list)  # per minute, oldest first
    dead: list[int] = field(default_factory=list)
    dead_by_reason: list[tuple[str, str, int]] = field(default_factory=list)  # value, label, count
    unknown_names: list[status.UnknownNameStatus] = field(default_factory=list)
    flow: list[status.FlowStatus] = field(default_factory=list)
    live_workers: int = 0
    progress: list[status.ProgressStatus] = field(default_factory=list)  # running jobs' reports

    @property
    def stalled(self) -> bool:
        """Jobs are due but no worker is alive to run them (runjobs not started, or all dead)."""
        return not self.live_workers and any(row.waiting for row in self.queues)

    @property
    def completed_total(self) -> int:
        return sum(self.completed)

    @property
    def dead_total(self) -> int:
        return sum(self.dead)


def snapshot(alias: str | None = None) -> Snapshot:
    """Gather the dashboard's figures in a few bounded queries (and two per limited group)."""
    alias = alias or conf.database()
    now = timezone.now()
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=WINDOW_MINUTES - 1)
    snap = Snapshot(now=now, start=start)

    rows = Job.objects.using(alias).counts_by_queue()
    by_queue = {
        row["queue"]: QueueRow(
            row["queue"],
            row["waiting"],
            row["scheduled"],
            row["running"],
            row["blocked"],
            row["oldest"],
            now,
        )
        for row in rows
    }
    # Queues the handlers use appear even when empty: "nothing waiting" is news too.
    declared = registry.declared_queues()
    for name in declared:
        by_queue.setdefault(name, QueueRow(name, now=now))
    for name, row in by_queue.items():
        row.declared = name in declared
    snap.queues = [by_queue[name] for name in sorted(by_queue)]
    snap.unknown_names = status.unknown_names(alias)
    snap.live_workers = WorkerBeat.objects.using(alias).live().count()
    snap.flow = status.flow_status(alias)
    if any(row.running for row in snap.queues):
        snap.progress = status.running_progress(alias)

    snap.completed = _per_minute(CompletionMarker.objects.using(alias), "completed_at", start)
    snap.dead = _per_minute(DeadLetter.objects.using(alias), "dead_at", start)

    labels = dict(DeadReason.choices)
    pending = DeadLetter.objects.using(alias).filter(replayed_at__isnull=True)
    snap.dead_by_reason = sorted(
        (
            (reason, str(labels.get(reason, reason)), n)
            for reason, n in status.count_by(pending, "reason").items()
        ),
        key=lambda item: -item[2],
    )
    return snap


def _per_minute(queryset: QuerySet[Any], field_name: str, start: datetime) -> list[int]:
    counts = [0] * WINDOW_MINUTES
    rows = (
        queryset.filter(**{f"{field_name}__gte": start})
        .order_by()
        .annotate(minute=TruncMinute(field_name))
        .values("minute")
        .annotate(n=Count("pk"))
    )
    for row in rows:
        index = int((row["minute"] - start).total_seconds() // 60)
        if 0 <= index < WINDOW_MINUTES:  # a clock ahead of ours puts a row past "now"
            counts[index] += row["n"]
    return counts


def bar_chart(
    values: list[int],
    *,
    start: datetime,
    title: str,
    unit: str,
    color: str,
    width: int = 720,
    height: int = 140,
) -> SafeString:
    """Return an SVG bar chart of per-minute counts, with a tooltip per bar."""
    left, right, top, bottom = 44, 8, 18, 20
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = max(values, default=0)
    scale = plot_h / peak if peak else 0.0
    step = plot_w / max(len(values), 1)
    tz = timezone.get_current_timezone()
    parts = [
        *svg_start("django-jobs-chart", width, height, title),
        format_html('<text x="{}" y="12" font-size="12" fill="#333">{}</text>', left, title),
        # Axes: the baseline and the peak's gridline, labelled.
        format_html(
            '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#999" stroke-width="1"/>',
            left,
            top + plot_h,
            left + plot_w,
            top + plot_h,
        ),
        format_html(
            '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#ddd" stroke-width="1"/>',
            left,
            top,
            left + plot_w,
            top,
        ),
        format_html(
            '<text x="{}" y="{}" font-size="10" text-anchor="end" fill="#666">{}</text>',
            left - 4,
            top + 4,
            peak,
        ),
        format_html(
            '<text x="{}" y="{}" font-size="10" text-anchor="end" fill="#666">0</text>',
            left - 4,
            top + plot_h + 4,
        ),
    ]
    for i, value in enumerate(values):
        minute = (start + timedelta(minutes=i)).astimezone(tz)
        bar_h = value * scale
        parts.append(
            format_html(
                '<rect x="{}" y="{}" width="{}" height="{}" fill="{}">'
                "<title>{}: {} {}</title></rect>",
                _n(left + i * step + 0.5),
                _n(top + plot_h - bar_h),
                _n(max(step - 1, 1)),
                _n(bar_h),
                color,
                minute.strftime("%H:%M"),
                value,
                unit,
            )
        )
    # The end labels are anchored inwards, or "now" would hang off the right edge.
    for i, label, anchor in (
        (0, f"-{len(values)} min", "start"),
        (len(values) // 2, f"-{len(values) // 2} min", "middle"),
        (len(values), "now", "end"),
    ):
        parts.append(
            format_html(
                '<text x="{}" y="{}" font-size="10" text-anchor="{}" fill="#666">{}</text>',
                _n(left + i * step),
                height - 4,
                anchor,
                label,
            )
        )
    parts.append(mark_safe("</svg>"))  # noqa: S308 - a constant
    return mark_safe("".join(str(p) for p in parts))  # noqa: S308 - every part is escaped above


def _n(value: float) -> str:
    """A coordinate with one decimal: short markup, and nothing format_html must escape."""
    return f"{value:.1f}"


def duration(value: timedelta | None) -> str:
    """Return a short human duration: 45s, 12m, 3h 5m, 2d 4h."""
    return "—" if value is None else limits.format_duration(value)


def svg_start(css_class: str, width: float, height: float, title: str) -> list[SafeString]:
    """The opening tag and title of an inline SVG image (the dashboard's charts, the graph)."""
    return [
        format_html(
            '<svg xmlns="http://www.w3.org/2000/svg" class="{}" role="img" '
            'width="{}" height="{}" viewBox="0 0 {} {}" aria-label="{}">',
            css_class,
            width,
            height,
            width,
            height,
            title,
        ),
        format_html("<title>{}</title>", title),
    ]
