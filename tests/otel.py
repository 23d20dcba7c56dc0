"""OpenTelemetry for the tracing tests: the real SDK, spans written as JSON lines.

tests/settings.py calls configure() in processes started with JOBS_TEST_SPANS set
(worker subprocesses): every span they end is appended to that file at once.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


def _hex(value: int | None, width: int) -> str | None:
    return None if value is None else f"{value:0{width}x}"


def as_dict(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": _hex(context.trace_id, 32),
        "span_id": _hex(context.span_id, 16),
        "parent_id": _hex(span.parent.span_id, 16) if span.parent is not None else None,
        "links": [
            {
                "trace_id": _hex(link.context.trace_id, 32),
                "span_id": _hex(link.context.span_id, 16),
                "attributes": dict(link.attributes or {}),
            }
            for link in span.links
        ],
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "events": [
            {"name": event.name, "attributes": dict(event.attributes or {})}
            for event in span.events
        ],
        "start": span.start_time,
        "end": span.end_time,
    }


class JsonLinesExporter(SpanExporter):
    """Append each span as one JSON line to path."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(as_dict(span), default=str) + "\n" for span in spans)
        with self._lock, self.path.open("a") as file:
            file.write(lines)
        return SpanExportResult.SUCCESS


def provider(path: str | Path) -> TracerProvider:
    made = TracerProvider()
    made.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(path)))
    return made


def configure(path: str) -> None:
    trace.set_tracer_provider(provider(path))


def read(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def render(spans: Sequence[dict[str, Any]]) -> str:
    """Draw spans as a tree, children under parents in start order, links named (the docs')."""
    by_id = {span["span_id"]: span for span in spans}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for span in sorted(spans, key=lambda s: s["start"]):
        parent = span["parent_id"] if span["parent_id"] in by_id else None
        children.setdefault(parent, []).append(span)
    shown = ("django_jobs.attempt", "django_jobs.outcome", "django_jobs.dead_reason")
    lines: list[str] = []

    def draw(span: dict[str, Any], depth: int) -> None:
        notes = [
            f"{key.split('.')[-1]}={span['attributes'][key]}"
            for key in shown
            if key in span["attributes"]
        ]
        notes += [
            f"link->{by_id[link['span_id']]['name']}"
            for link in span["links"]
            if link["span_id"] in by_id
        ]
        if span["status"] == "ERROR":
            notes.append("ERROR")
        tail = f"  ({', '.join(notes)})" if notes else ""
        trace = span["trace_id"][:4]
        lines.append(f"{trace} {'  ' * depth}{span['kind']:<8} {span['name']}{tail}")
        for child in children.get(span["span_id"], []):
            draw(child, depth + 1)

    for root in children.get(None, []):
        draw(root, 0)
    return "\n".join(lines)
