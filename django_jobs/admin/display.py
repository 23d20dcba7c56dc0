"""How the jobs admin shows values: cut cells, bounded <pre> blocks, masked JSON, times."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import conditional_escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _

from django_jobs import limits, payloads
from django_jobs.attempts import error_summary

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

EMPTY = "—"


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
# Control characters (but tab and line ends) and the bidirectional controls, which names
# and keys refuse: a right-to-left override (U+202E) would show "exe.txt" for "txt.exe".
_UNSHOWABLE = re.compile(
    r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
    r"\ud800-\udfff]"
)


def showable(value: Any) -> str:
    """Return str(value) with NUL, lone surrogates, control and bidi characters as \\u escapes."""
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

    A name (dotted path, queue, worker id), or an error led by its exception's dotted
    path, may wrap after its dots, dashes and colons.
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


@dataclass(frozen=True)
class Unreadable:
    """A JSON column's value that json could not decode (nested past Python's recursion limit).

    Only a hand-written row holds one; the admin's get_object puts this in its place.
    """

    size: int | None  # characters of its text


def json_text(value: Any) -> str:
    """Return a decoded JSON value as indented text with the MASK_KEYS masked."""
    return json.dumps(payloads.mask(value), indent=2, ensure_ascii=False, default=str)


def not_shown(why: Any, size: int | None = None) -> SafeString:
    """Say that a value that may hold secrets is not shown, why, and its size; never the value."""
    if size is None:
        note = _("Not shown, as its secrets cannot be masked: %(why)s.") % {"why": why}
    else:
        note = _("Not shown, as its secrets cannot be masked: %(why)s (%(size)s characters).") % {
            "why": why,
            "size": f"{size:,}",
        }
    return format_html('<p class="errornote django-jobs-not-shown">{}</p>', note)


def _too_deep() -> str:
    return str(_("nested more than %(n)s levels deep") % {"n": limits.MAX_NESTING})


def _masked(value: Any, size: int | None, limit: int) -> SafeString:
    """A decoded JSON value masked in a <pre>, or not_shown() when masking cannot be trusted."""
    if payloads.nesting(value) > limits.MAX_NESTING:
        return not_shown(_too_deep(), size)
    try:
        shown = json_text(value)
    except (ValueError, TypeError, RecursionError):
        return not_shown(_("it cannot be written as JSON"), size)
    return bounded_pre(shown, limit, css="django-jobs-json")


def pretty_payload(text: Any) -> SafeString:
    """Return a payload as indented JSON with the MASK_KEYS masked, in a <pre>.

    Text that is not JSON, or nests deeper than limits.MAX_NESTING (a hand-written
    row: enqueue refuses both), is not shown: only why, and its size.
    """
    size = len(text) if isinstance(text, str) else None
    try:
        value = payloads.decode(text)
    except (ValueError, TypeError) as exc:
        # json's messages say where, never what: "Expecting value: line 1 column 5 (char 4)".
        return not_shown(_("not valid JSON (%(error)s)") % {"error": showable(exc)}, size)
    return _masked(value, size, DETAIL_LIMIT)


def pretty_json(value: Any, limit: int = DETAIL_LIMIT) -> SafeString | str:
    """Return a decoded JSON field (a result, worker stats) like a payload."""
    if value is None:
        return EMPTY
    if isinstance(value, Unreadable):
        return not_shown(_too_deep(), value.size)
    return _masked(value, None, limit)


def attempt_history(errors: Any) -> SafeString | str:
    """Return every attempt's error as a table, tracebacks folded (no script needed)."""
    if not errors:
        return EMPTY
    if isinstance(errors, Unreadable) or payloads.nesting(errors) > limits.MAX_NESTING:
        return pretty_json(errors)  # not shown: only a hand edit nests entries this deep
    if not isinstance(errors, list):  # a hand-edited row: show what is there, masked
        return format_html(
            '<p class="errornote">{}</p>{}',
            _("Not a list of attempts:"),
            pretty_json(errors),
        )
    hidden = max(0, len(errors) - ATTEMPTS_SHOWN)
    rows = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        (_attempt_row(error) for error in errors[hidden:]),
    )
    table = format_html(
        '<table class="django-jobs-attempts"><thead><tr><th>{}</th><th>{}</th><th>{}</th>'
        "<th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>",
        _("attempt"),
        _("at"),
        _("worker"),
        _("error"),
        _("traceback"),
        rows,
    )
    if not hidden:
        return table
    note = _("The first %(hidden)s attempts are not shown; the latest %(shown)s are.") % {
        "hidden": hidden,
        "shown": ATTEMPTS_SHOWN,
    }
    return format_html('<p class="help">{}</p>{}', note, table)


def _attempt_row(entry: Any) -> tuple[Any, ...]:
    limit = ATTEMPT_TEXT_LIMIT
    if not isinstance(entry, dict):
        return ("?", EMPTY, EMPTY, pretty_json(entry, limit), EMPTY)
    error = {key: _entry_text(entry.get(key)) for key in _ENTRY_KEYS if key in entry}
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


# The fields of an attempt's error entry that the table shows (attempts.error_entry's).
_ENTRY_KEYS = ("attempt", "at", "worker", "type", "message", "traceback")


def _entry_text(value: Any) -> Any:
    """A field of a hand-edited entry that is a list or an object: as masked JSON text."""
    if not isinstance(value, dict | list):
        return value
    if payloads.nesting(value) > limits.MAX_NESTING:
        return str(
            _("[not shown, as its secrets cannot be masked: %(why)s]") % {"why": _too_deep()}
        )
    return json.dumps(payloads.mask(value), ensure_ascii=False, default=str)


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
    # To the minute: without the seconds, and with the " UTC" of a time shown in UTC.
    return format_html('<span title="{}">{}</span>', full, full[:16] + full[19:])


def when_column(field: str, description: StrOrPromise) -> Callable[[Any, Any], SafeString | str]:
    """Return a list column showing the time in `field` (as list_when does), sortable by it."""

    @admin.display(description=description, ordering=field)
    def column(model_admin: Any, obj: Any) -> SafeString | str:
        return list_when(getattr(obj, field))

    return column


def when_field(model: Any, field: str) -> Callable[[Any, Any], str]:
    """Return a page field showing the time in `field` as `when` does, labelled as the field.

    Django's own rendering of a DateTimeField converts to the current time zone and
    answers 500 for a time near datetime.min or max written by hand.
    """

    @admin.display(description=model._meta.get_field(field).verbose_name)
    def shown(model_admin: Any, obj: Any) -> str:
        return when(getattr(obj, field))

    return shown


def when(value: datetime | None) -> str:
    """Return a time in the current time zone, short enough for a list column."""
    if value is None:
        return EMPTY
    if timezone.is_aware(value):
        try:
            value = timezone.localtime(value)
        except OverflowError:
            # A row written by hand near datetime.min or max (enqueue refuses such run
            # times): in this time zone it would fall in year 0 or 10000.
            try:
                return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            except OverflowError:  # an offset of its own (a time in an error entry)
                return value.strftime("%Y-%m-%d %H:%M:%S UTC%z")
    return value.strftime("%Y-%m-%d %H:%M:%S")
