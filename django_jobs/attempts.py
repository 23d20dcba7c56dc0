"""What a job row records of its attempts: the lease token of the running one, failed ones' errors.

A leaf: the store, the worker and the admin build and read these through the
functions here only; why a job died (``DeadReason``) is listed here once.
``sql.CLAIM`` builds the lease-expired entry in SQL from the same constants, and
``sql.py``'s ``split_part(locked_by, '#', 1)`` is the SQL twin of ``worker_of``
(tests pin both).
"""

from __future__ import annotations

import traceback as tb
from datetime import datetime
from typing import Any

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from django_jobs.payloads import safe_str, storable_text

# Longest message and traceback kept per attempt's error (characters): a handler
# raising a 10 MB message must not make 10 MB rows, log lines or admin pages.
MAX_MESSAGE = 2_000
MAX_TRACEBACK = 16_000
# Longest type name and worker id kept in an error entry.
MAX_LABEL = 300

# The entry the claim writes for an attempt whose worker lost its lease (sql.CLAIM too).
LEASE_EXPIRED = "django_jobs.LeaseExpired"
LEASE_EXPIRED_MESSAGE = (
    "the lease expired before the attempt settled (worker killed, hung or cut off)"
)


class DeadReason(models.TextChoices):
    """Why a job went to the dead letters (DeadLetter.reason): the one list of them."""

    INVALID_PAYLOAD = "invalid_payload", _("invalid payload")
    UNKNOWN_NAME = "unknown_name", _("unknown name")
    ATTEMPTS_EXHAUSTED = "attempts_exhausted", _("attempts exhausted")
    FATAL = "fatal", _("fatal error")
    CANCELLED = "cancelled", _("cancelled")
    # A workflow step whose parent died, when the step asked for on_parent_dead="dead".
    PARENT_DEAD = "parent_dead", _("parent dead")
    # A hand-edited column the worker cannot use, or a row the database refused to update.
    MALFORMED = "malformed", _("malformed row")
    # An encrypted payload no key of ENCRYPTION_KEYS decrypts (removed, or altered).
    UNDECRYPTABLE = "undecryptable", _("undecryptable payload")


# A lease token is "<worker id>#<claim number>": the worker id holds no "#".
_SEPARATOR = "#"


def lease_token(worker_id: str, claim: int) -> str:
    """Return the token a worker's claim number `claim` leases its jobs to."""
    return f"{worker_id}{_SEPARATOR}{claim}"


def worker_of(token: str) -> str:
    """Return the worker id of a lease token (SQL twin: split_part(token, '#', 1))."""
    return token.partition(_SEPARATOR)[0]


def error_entry(
    attempt: int,
    *,
    exc: BaseException | None = None,
    kind: str | None = None,
    message: Any = None,
    traceback: Any = None,
    worker: str = "",
    at: datetime | None = None,
) -> dict[str, Any]:
    """Return one attempt's error entry, every text storable and within its cap.

    The one constructor of the entries in ``Job.errors`` and ``DeadLetter.errors``.
    With `exc`, the type, message and traceback default to that exception's; it
    never raises, even for an exception whose __str__ or traceback raises.
    """
    if exc is not None:
        kind = type_name(exc) if kind is None else kind
        message = safe_str(exc) if message is None else message
        traceback = format_traceback(exc) if traceback is None else traceback
    traceback = storable_text("" if traceback is None else traceback)
    if len(traceback) > MAX_TRACEBACK:
        traceback = "…" + traceback[-MAX_TRACEBACK:]
    return {
        "attempt": attempt,
        "at": (at or timezone.now()).isoformat(),
        "type": storable_text(kind or "", MAX_LABEL),
        "message": storable_text("" if message is None else message, MAX_MESSAGE),
        "traceback": traceback,
        "worker": storable_text(worker, MAX_LABEL),
    }


def lease_expired_entry(attempt: int, token: str, at: datetime | None = None) -> dict[str, Any]:
    """Return the entry of an attempt whose lease (held by `token`) expired before it settled."""
    return error_entry(
        attempt, kind=LEASE_EXPIRED, message=LEASE_EXPIRED_MESSAGE, worker=worker_of(token), at=at
    )


def error_summary(error: dict[str, Any]) -> str:
    """Return an entry as one line: "type: message"."""
    kind = error.get("type", "")
    message = error.get("message", "")
    return f"{kind}: {message}" if kind and message else kind or message


def usable_errors(errors: Any) -> list[dict[str, Any]]:
    """Return a row's errors list, without the items a hand edit left that are not entries."""
    if not isinstance(errors, list):
        return []
    return [e for e in errors if type(e) is dict]


def type_name(exc: BaseException) -> str:
    """Return the dotted name of an exception's type, even under a hostile metaclass."""
    kind = type(exc)
    try:
        return f"{kind.__module__}.{kind.__qualname__}"
    except BaseException:  # noqa: BLE001 - a hostile metaclass may break even this
        return "<unknown exception type>"


def format_traceback(exc: BaseException) -> str:
    """Return exc's traceback as text, each part cut to MAX_MESSAGE, never raising."""
    try:
        parts = tb.format_exception(exc)
    except BaseException as error:  # noqa: BLE001 - e.g. a __notes__ that raises
        return f"<the traceback could not be formatted: {type_name(error)}>"
    # A part is one frame or one exception line: cut a 10 MB message here, before joining.
    return "".join(
        part if len(part) <= MAX_MESSAGE else f"{storable_text(part, MAX_MESSAGE)}\n"
        for part in parts
    )
