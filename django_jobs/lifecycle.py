"""The job lifecycle: which transition each attempt's outcome leads to.

Pure: no database, no threads, no settings. The worker asks ``on_claim`` what to do
with a job it just claimed and ``on_outcome`` what to do with what an attempt
reported; it carries the answer out through the store's named methods
(complete, retry, dead_letter, snooze, release). Every decision between retrying
and dead-lettering a job is made here.

Error entries are not built here (they need a clock and a worker id): a
transition carries either an entry an executor already built, an exception for
the worker to describe, or a ``Cause`` for it to write down.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from django_jobs import limits
from django_jobs.attempts import LEASE_EXPIRED, DeadReason, error_summary
from django_jobs.exceptions import JobCancelled, Snooze


class JobView(Protocol):
    """What the lifecycle reads of a claimed job (models.ClaimedJob has it)."""

    attempts: int
    max_attempts: int
    errors: list[dict[str, Any]]
    completed: bool

    def malformed(self) -> str | None: ...


class BackoffPolicy(Protocol):
    def delay(self, attempt: int) -> float: ...


class Policy(Protocol):
    """What the lifecycle reads of a handler (registry.Handler has it)."""

    def get_backoff(self) -> BackoffPolicy: ...


# ---- outcomes: what an attempt (or a settle of it) reported -------------------


@dataclass(slots=True)
class Succeeded:
    result: str | None


@dataclass(slots=True)
class SettledAtomically:
    """An atomic handler committed its effects, the marker and the job's deletion."""


@dataclass(slots=True)
class AlreadyDone:
    """An atomic handler found the key's marker at commit: its effects were rolled back."""


@dataclass(slots=True)
class Lost:
    """The lease was taken over before an atomic handler could commit."""


@dataclass(slots=True)
class Unstarted:
    """The worker was stopping when a thread picked the job up: it did not run."""


@dataclass(slots=True)
class Failed:
    error: dict[str, Any]
    fatal: bool = False
    exc: BaseException | None = None


@dataclass(slots=True)
class Invalid:
    """The payload did not decode, decrypt or validate: retrying cannot help."""

    error: dict[str, Any]
    reason: DeadReason = DeadReason.INVALID_PAYLOAD


@dataclass(slots=True)
class Snoozed:
    """The handler raised Snooze: run again after `seconds`, attempt given back."""

    seconds: float


@dataclass(slots=True)
class CancelRequested:
    """An operator cancelled a job this worker holds; `started`: a thread has it."""

    started: bool


@dataclass(slots=True)
class Refused:
    """The database refused the write of `step` for this job (not a connection error).

    `error` is the entry describing the refusal; `original` the failure whose
    retry was refused (step "retry"); `exc` the exception to report with what
    follows (the refusal's, or the original failure's).
    """

    step: str  # "complete", "snooze", "retry" or "dead_letter"
    error: dict[str, Any] | None = None
    original: dict[str, Any] | None = None
    exc: BaseException | None = None


Outcome = (
    Succeeded
    | SettledAtomically
    | AlreadyDone
    | Lost
    | Unstarted
    | Failed
    | Invalid
    | Snoozed
    | CancelRequested
    | Refused
)


# ---- transitions: what the worker does about it -------------------------------


@dataclass(frozen=True, slots=True)
class Cause:
    """An error entry for the worker to write (worker None: this worker)."""

    attempt: int
    kind: str
    message: str
    traceback: str = ""
    worker: str | None = None


@dataclass(frozen=True, slots=True)
class Run:
    """Hand the job to a handler; `retaken`: it was taken over from an expired lease."""

    retaken: bool = False


@dataclass(frozen=True, slots=True)
class Complete:
    """Delete the job and write its marker; `skipped`: it did not run (or was rolled back)."""

    result: str | None
    skipped: bool = False


@dataclass(frozen=True, slots=True)
class Completed:
    """Nothing to write: the handler's own transaction settled the job."""


@dataclass(frozen=True, slots=True)
class Retry:
    """Put the job back, due in `delay` seconds, with error appended."""

    delay: float
    error: dict[str, Any]
    exc: BaseException | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Move the job to the dead letters with reason and error.

    `attempts` overrides the attempts recorded (an attempt that never ran is not
    counted); `drop_last_error` leaves out the job's last entry (the error replaces it).
    """

    reason: str
    error: dict[str, Any] | Cause | BaseException
    attempts: int | None = None
    exc: BaseException | None = None
    drop_last_error: bool = False
    retaken: bool = False


@dataclass(frozen=True, slots=True)
class SnoozeFor:
    """Put the job back, due in `seconds`, its attempt not counted."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Release:
    """Give the job back at once, its attempt not counted."""

    retaken: bool = False


@dataclass(frozen=True, slots=True)
class Interrupt:
    """Tell the running handler to stop (ctx.cancelled); its outcome decides the rest."""


@dataclass(frozen=True, slots=True)
class Abandon:
    """Write nothing: the lease is another worker's, or the database takes no letter."""

    why: str


# The answers on the hot path, made once (transitions are immutable).
_RUN = Run()
_RUN_RETAKEN = Run(retaken=True)

Transition = (
    Run | Complete | Completed | Retry | DeadLetter | SnoozeFor | Release | Interrupt | Abandon
)


# ---- the decisions -------------------------------------------------------------


def on_claim(job: JobView, *, has_handler: bool) -> Transition:
    """Decide what to do with a job just claimed (its attempt already counted)."""
    if job.completed:
        return Complete(None, skipped=True)
    problem = job.malformed()
    if problem is not None:
        # A hand-edited row: say so in its letter instead of tripping over it.
        return DeadLetter(
            DeadReason.MALFORMED,
            Cause(
                job.attempts,
                "django_jobs.MalformedJob",
                f"the job row cannot be run as it is: {problem}",
            ),
        )
    retaken = _retaken(job)
    if job.attempts > job.max_attempts:
        # The previous attempt was lost with its worker (killed, OOM, os._exit).
        last = job.errors[-1] if job.errors else {}
        return DeadLetter(
            DeadReason.ATTEMPTS_EXHAUSTED,
            Cause(
                job.attempts - 1,
                last.get("type", LEASE_EXPIRED),
                f"{job.max_attempts} attempts started and none settled; "
                f"the last one: {error_summary(last) or 'worker lost'}",
                last.get("traceback", ""),
            ),
            attempts=job.attempts - 1,
            drop_last_error=True,
            retaken=retaken,
        )
    if not has_handler:
        # The claim takes only registered names, so the handler was removed since.
        # One worker lacking it does not make the name unknown (another may have
        # it): give the job back, and let the upkeep bury it after the grace.
        return Release(retaken=retaken)
    return _RUN_RETAKEN if retaken else _RUN


def _retaken(job: JobView) -> bool:
    """True if the claim took job over from a worker whose lease expired.

    That attempt may have had effects, and this one repeats them.
    """
    if not job.errors:
        return False
    last = job.errors[-1]
    return last.get("type") == LEASE_EXPIRED and last.get("attempt") == job.attempts - 1


def on_outcome(
    job: JobView,
    outcome: Outcome,
    *,
    policy: Policy,
    cancel_requested: bool = False,
) -> Transition:
    """Decide what an attempt's outcome (or a settle's refusal) leads to."""
    if isinstance(outcome, Succeeded):
        return Complete(outcome.result)
    if isinstance(outcome, SettledAtomically):
        return Completed()
    if isinstance(outcome, AlreadyDone):
        return Complete(None, skipped=True)
    if isinstance(outcome, Lost):
        return Abandon("lease lost before the atomic handler committed")
    if isinstance(outcome, Unstarted):
        return Release()
    if isinstance(outcome, Invalid):
        return DeadLetter(outcome.reason, outcome.error)
    if isinstance(outcome, Snoozed):
        if cancel_requested:
            exc = Snooze(outcome.seconds)
            return DeadLetter(DeadReason.CANCELLED, exc, exc=exc)
        return SnoozeFor(outcome.seconds)
    if isinstance(outcome, CancelRequested):
        if outcome.started:
            return Interrupt()
        return DeadLetter(
            DeadReason.CANCELLED,
            JobCancelled("cancelled before it started"),
            attempts=job.attempts - 1,
        )
    if isinstance(outcome, Refused):
        return _on_refused(job, outcome, policy=policy, cancel_requested=cancel_requested)
    if isinstance(outcome, Failed):
        return _on_failure(job, outcome, policy=policy, cancel_requested=cancel_requested)
    raise TypeError(f"not an outcome: {outcome!r}")


def _on_failure(
    job: JobView, outcome: Failed, *, policy: Policy, cancel_requested: bool
) -> Transition:
    if cancel_requested:  # the handler stopped after an operator cancelled it
        reason = DeadReason.CANCELLED
    elif outcome.fatal:
        reason = DeadReason.FATAL
    elif job.attempts >= job.max_attempts:
        reason = DeadReason.ATTEMPTS_EXHAUSTED
    else:
        delay = retry_delay(policy.get_backoff(), job.attempts)
        return Retry(delay, outcome.error, exc=outcome.exc)
    return DeadLetter(reason, outcome.error, exc=outcome.exc)


def _on_refused(
    job: JobView, outcome: Refused, *, policy: Policy, cancel_requested: bool
) -> Transition:
    if outcome.step in ("complete", "snooze"):
        # The write itself fails (a trigger, a constraint, a value the database
        # refuses): a failed attempt with the database's error, bounded by max_attempts.
        failed = Failed(outcome.error or {}, exc=outcome.exc)
        return _on_failure(job, failed, policy=policy, cancel_requested=cancel_requested)
    if outcome.step == "retry":
        # The database will not take the row back: keep the true cause in a letter
        # rather than leave the job to its lease (and the next worker to the same end).
        original = outcome.original or {}
        return DeadLetter(
            DeadReason.MALFORMED,
            Cause(
                original.get("attempt", job.attempts),
                original.get("type", ""),
                f"{original.get('message', '')} (the database refused to record the retry: "
                f"{(outcome.error or {}).get('message', '')})",
                original.get("traceback", ""),
                original.get("worker"),
            ),
            exc=outcome.exc,
        )
    # Nothing this worker writes for the job is taken: its lease expires and the
    # job comes round again, each claim counting an attempt.
    return Abandon(f"the database refused its {outcome.step}")


def retry_delay(backoff: BackoffPolicy, attempt: int) -> float:
    """Return the backoff's delay after failed attempt `attempt`, within [0, MAX_SECONDS]."""
    delay = backoff.delay(attempt)
    if isinstance(delay, bool) or not isinstance(delay, int | float):
        return 0.0
    if isinstance(delay, int):  # compared as an int: one beyond float would overflow
        return float(min(max(delay, 0), limits.MAX_SECONDS))
    if math.isnan(delay):
        return 0.0
    return min(max(delay, 0.0), float(limits.MAX_SECONDS))
