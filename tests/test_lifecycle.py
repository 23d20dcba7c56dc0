"""The job lifecycle, transition by transition: no database, no threads."""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from django_jobs import lifecycle, limits
from django_jobs.attempts import DeadReason
from django_jobs.exceptions import JobCancelled, Snooze
from django_jobs.lifecycle import (
    Abandon,
    AlreadyDone,
    CancelRequested,
    Cause,
    Complete,
    Completed,
    DeadLetter,
    Failed,
    Interrupt,
    Invalid,
    Lost,
    Refused,
    Release,
    Retry,
    Run,
    SettledAtomically,
    Snoozed,
    SnoozeFor,
    Succeeded,
    Unstarted,
    on_claim,
    on_outcome,
)
from django_jobs.registry import Backoff

MAX_SECONDS = float(limits.MAX_SECONDS)


@dataclass
class FakeJob:
    attempts: int = 1
    max_attempts: int = 3
    errors: list[dict[str, Any]] = field(default_factory=list)
    completed: bool = False
    problem: str | None = None

    def malformed(self) -> str | None:
        return self.problem


@dataclass
class FixedDelay:
    seconds: Any
    asked: list[int] = field(default_factory=list)

    def delay(self, attempt: int) -> Any:
        self.asked.append(attempt)
        return self.seconds


@dataclass
class FakePolicy:
    backoff: Any = field(default_factory=lambda: FixedDelay(7.0))
    looked_up: int = 0

    def get_backoff(self) -> Any:
        self.looked_up += 1
        return self.backoff


def error(attempt: int = 1, kind: str = "builtins.ValueError", message: str = "boom") -> dict:
    return {
        "attempt": attempt,
        "at": "2026-11-30T00:00:00+00:00",
        "type": kind,
        "message": message,
        "traceback": "Traceback ...",
        "worker": "host:1:abc",
    }


def decide(job: FakeJob, outcome: Any, *, policy: Any = None, cancel: bool = False) -> Any:
    return on_outcome(job, outcome, policy=policy or FakePolicy(), cancel_requested=cancel)


# ---- at claim ---------------------------------------------------------------------


def test_a_claimed_job_with_a_handler_runs():
    assert on_claim(FakeJob(), has_handler=True) == Run(retaken=False)


def test_a_job_whose_marker_exists_completes_without_running():
    assert on_claim(FakeJob(completed=True), has_handler=True) == Complete(None, skipped=True)
    # Even when the row is malformed or its handler gone: its key is done.
    job = FakeJob(completed=True, problem="bad", attempts=9, max_attempts=1)
    assert on_claim(job, has_handler=False) == Complete(None, skipped=True)


def test_a_malformed_row_is_dead_lettered_naming_the_problem():
    transition = on_claim(
        FakeJob(attempts=2, problem="its attempts column is not an integer"), has_handler=True
    )
    assert transition == DeadLetter(
        DeadReason.MALFORMED,
        Cause(
            2,
            "django_jobs.MalformedJob",
            "the job row cannot be run as it is: its attempts column is not an integer",
        ),
    )


def test_a_malformed_row_is_never_looked_at_further():
    # Its errors are not a list: the take-over check must not read them.
    job = FakeJob(problem="errors", errors="not a list")  # type: ignore[arg-type]
    assert on_claim(job, has_handler=True).reason == DeadReason.MALFORMED


def test_a_job_past_max_attempts_at_claim_is_dead_lettered_with_the_lost_attempt():
    lost = error(attempt=3, kind=lifecycle.LEASE_EXPIRED, message="the lease expired")
    job = FakeJob(attempts=4, max_attempts=3, errors=[error(2), lost])
    transition = on_claim(job, has_handler=True)
    assert transition == DeadLetter(
        DeadReason.ATTEMPTS_EXHAUSTED,
        Cause(
            3,
            lifecycle.LEASE_EXPIRED,
            "3 attempts started and none settled; "
            "the last one: django_jobs.LeaseExpired: the lease expired",
            "Traceback ...",
        ),
        attempts=3,
        drop_last_error=True,
        retaken=True,
    )


def test_a_job_past_max_attempts_without_errors_says_worker_lost():
    transition = on_claim(FakeJob(attempts=2, max_attempts=1), has_handler=False)
    assert isinstance(transition, DeadLetter)
    assert transition.error == Cause(
        1,
        lifecycle.LEASE_EXPIRED,
        "1 attempts started and none settled; the last one: worker lost",
        "",
    )
    assert (transition.attempts, transition.retaken) == (1, False)


def test_the_last_attempt_still_runs():
    assert on_claim(FakeJob(attempts=3, max_attempts=3), has_handler=True) == Run()


def test_max_attempts_at_the_integer_limit():
    top = limits.MAX_INT
    assert on_claim(FakeJob(attempts=top, max_attempts=top), has_handler=True) == Run()
    assert on_claim(FakeJob(attempts=top - 1, max_attempts=top), has_handler=True) == Run()
    assert isinstance(
        on_claim(FakeJob(attempts=top + 1, max_attempts=top), has_handler=True), DeadLetter
    )


def test_a_job_whose_handler_is_gone_is_released():
    assert on_claim(FakeJob(), has_handler=False) == Release(retaken=False)


@pytest.mark.parametrize(
    ("errors", "retaken"),
    [
        ([], False),
        ([error(1, kind=lifecycle.LEASE_EXPIRED)], True),
        ([error(1, kind="builtins.ValueError")], False),
        ([error(0, kind=lifecycle.LEASE_EXPIRED)], False),  # an older attempt's expiry
        ([error(1, kind=lifecycle.LEASE_EXPIRED), error(1)], False),  # not the last entry
        ([{}], False),
    ],
)
def test_a_job_taken_over_from_an_expired_lease_is_flagged(errors, retaken):
    job = FakeJob(attempts=2, errors=errors)
    assert on_claim(job, has_handler=True) == Run(retaken=retaken)
    assert on_claim(job, has_handler=False) == Release(retaken=retaken)


# ---- after an attempt ----------------------------------------------------------------


def test_success_completes_with_the_result():
    policy = FakePolicy()
    assert decide(FakeJob(), Succeeded('{"a": 1}'), policy=policy) == Complete('{"a": 1}')
    assert policy.looked_up == 0  # no backoff looked up on the hot path


def test_an_atomic_success_is_already_settled():
    assert decide(FakeJob(), SettledAtomically()) == Completed()


def test_an_atomic_handler_that_found_the_marker_completes_as_skipped():
    assert decide(FakeJob(), AlreadyDone()) == Complete(None, skipped=True)


def test_an_atomic_handler_that_lost_its_lease_writes_nothing():
    assert isinstance(decide(FakeJob(), Lost()), Abandon)


def test_a_job_unstarted_at_shutdown_is_released():
    assert decide(FakeJob(), Unstarted()) == Release()


def test_an_invalid_payload_is_dead_lettered_even_with_attempts_left():
    entry = error()
    assert decide(FakeJob(attempts=1, max_attempts=5), Invalid(entry)) == DeadLetter(
        DeadReason.INVALID_PAYLOAD, entry
    )


def test_a_failure_with_attempts_left_retries_after_the_backoff():
    backoff = FixedDelay(12.5)
    exc = ValueError("boom")
    entry = error(attempt=2)
    transition = decide(
        FakeJob(attempts=2, max_attempts=3), Failed(entry, exc=exc), policy=FakePolicy(backoff)
    )
    assert transition == Retry(12.5, entry, exc=exc)
    assert backoff.asked == [2]


def test_a_failure_on_the_last_attempt_is_dead_lettered():
    entry, exc = error(attempt=3), ValueError("boom")
    policy = FakePolicy()
    transition = decide(FakeJob(attempts=3, max_attempts=3), Failed(entry, exc=exc), policy=policy)
    assert transition == DeadLetter(DeadReason.ATTEMPTS_EXHAUSTED, entry, exc=exc)
    assert policy.looked_up == 0


def test_a_failure_past_max_attempts_is_dead_lettered():
    transition = decide(FakeJob(attempts=7, max_attempts=3), Failed(error()))
    assert transition.reason == DeadReason.ATTEMPTS_EXHAUSTED


def test_a_fatal_error_is_dead_lettered_on_the_first_attempt():
    transition = decide(FakeJob(attempts=1, max_attempts=5), Failed(error(), fatal=True))
    assert transition.reason == DeadReason.FATAL


def test_a_failure_after_a_cancel_request_is_dead_lettered_as_cancelled():
    for fatal in (False, True):
        transition = decide(FakeJob(attempts=1), Failed(error(), fatal=fatal), cancel=True)
        assert transition.reason == DeadReason.CANCELLED


def test_at_the_integer_limit_a_failure_is_dead_lettered_not_retried():
    top = limits.MAX_INT
    assert decide(FakeJob(attempts=top, max_attempts=top), Failed(error())).reason == (
        DeadReason.ATTEMPTS_EXHAUSTED
    )
    backoff = Backoff.exponential(base=2, ceiling=MAX_SECONDS, jitter=0)
    transition = decide(
        FakeJob(attempts=top - 1, max_attempts=top), Failed(error()), policy=FakePolicy(backoff)
    )
    assert transition.delay == MAX_SECONDS  # 2 ** (attempt - 1) is capped, not overflowed


@pytest.mark.parametrize(
    ("delay", "expected"),
    [
        (0.0, 0.0),
        (0, 0.0),
        (3, 3.0),
        (MAX_SECONDS, MAX_SECONDS),
        (MAX_SECONDS + 1, MAX_SECONDS),
        (math.inf, MAX_SECONDS),
        (10**400, MAX_SECONDS),  # beyond float
        (-5.0, 0.0),
        (-math.inf, 0.0),
        (math.nan, 0.0),
        (None, 0.0),
        ("60", 0.0),
        (True, 0.0),
    ],
    ids=lambda value: repr(value)[:24],
)
def test_the_retry_delay_stays_a_storable_duration_whatever_the_policy_returns(delay, expected):
    transition = decide(FakeJob(), Failed(error()), policy=FakePolicy(FixedDelay(delay)))
    assert transition.delay == expected
    assert type(transition.delay) is float


def test_real_backoffs_near_the_ten_year_cap():
    backoff = Backoff.exponential(base=MAX_SECONDS, ceiling=MAX_SECONDS, jitter=0.5)
    for attempt in (1, 2, 63, 64, 10**6):
        assert lifecycle.retry_delay(backoff, attempt) <= MAX_SECONDS
    assert lifecycle.retry_delay(Backoff.fixed(MAX_SECONDS, jitter=0), 1) == MAX_SECONDS


def test_a_snooze_puts_the_job_back():
    assert decide(FakeJob(), Snoozed(30.0)) == SnoozeFor(30.0)
    assert decide(FakeJob(attempts=3, max_attempts=3), Snoozed(0.0)) == SnoozeFor(0.0)


def test_a_snooze_after_a_cancel_request_is_dead_lettered_as_cancelled():
    transition = decide(FakeJob(), Snoozed(30.0), cancel=True)
    assert isinstance(transition, DeadLetter)
    assert transition.reason == DeadReason.CANCELLED
    assert type(transition.error) is Snooze and transition.error.seconds == 30.0
    assert transition.exc is transition.error


def test_a_cancel_request_interrupts_a_started_job():
    assert decide(FakeJob(), CancelRequested(started=True)) == Interrupt()


def test_a_cancel_request_dead_letters_a_job_not_started_without_counting_its_attempt():
    transition = decide(FakeJob(attempts=4, max_attempts=5), CancelRequested(started=False))
    assert isinstance(transition, DeadLetter)
    assert (transition.reason, transition.attempts) == (DeadReason.CANCELLED, 3)
    assert type(transition.error) is JobCancelled


# ---- the database refused a settle ----------------------------------------------------


@pytest.mark.parametrize("step", ["complete", "snooze"])
def test_a_refused_write_is_a_failed_attempt(step):
    exc = ValueError("value too long")
    refusal = error(message="value too long")
    job = FakeJob(attempts=1, max_attempts=2)
    assert decide(
        job, Refused(step, refusal, exc=exc), policy=FakePolicy(FixedDelay(4.0))
    ) == Retry(4.0, refusal, exc=exc)
    job.attempts = 2
    assert decide(job, Refused(step, refusal, exc=exc)) == DeadLetter(
        DeadReason.ATTEMPTS_EXHAUSTED, refusal, exc=exc
    )
    assert decide(job, Refused(step, refusal), cancel=True).reason == DeadReason.CANCELLED


def test_a_refused_retry_is_dead_lettered_as_malformed_keeping_the_true_cause():
    original = error(attempt=1, kind="builtins.KeyError", message="'x'")
    exc = KeyError("x")
    refused = Refused("retry", error(message="a trigger said no"), original=original, exc=exc)
    transition = decide(FakeJob(attempts=1, max_attempts=5), refused)
    assert transition == DeadLetter(
        DeadReason.MALFORMED,
        Cause(
            1,
            "builtins.KeyError",
            "'x' (the database refused to record the retry: a trigger said no)",
            "Traceback ...",
            "host:1:abc",
        ),
        exc=exc,
    )


def test_a_refused_dead_letter_is_abandoned_to_its_lease():
    assert isinstance(decide(FakeJob(), Refused("dead_letter")), Abandon)


# ---- hostile inputs ---------------------------------------------------------------------


def test_an_unknown_outcome_is_a_type_error():
    with pytest.raises(TypeError):
        decide(FakeJob(), object())


def test_hostile_error_entries_do_not_break_the_decisions():
    weird = [{"type": 5, "message": None}, {"attempt": "x"}]
    job = FakeJob(attempts=3, max_attempts=2, errors=weird)
    transition = on_claim(job, has_handler=True)
    assert isinstance(transition, DeadLetter) and transition.retaken is False
    refused = Refused("retry", {}, original={})
    assert decide(FakeJob(), refused).reason == DeadReason.MALFORMED


# ---- the module stays a leaf ------------------------------------------------------------


def test_the_reasons_are_the_dead_letter_reasons_defined_once():
    # One list: lifecycle's transitions name the members of DeadReason, which the
    # letters' reason column takes its choices from.
    from django_jobs import models

    assert lifecycle.DeadReason is models.DeadReason is DeadReason
    reason = models.DeadLetter._meta.get_field("reason")
    assert list(reason.choices or ()) == DeadReason.choices


def test_the_lifecycle_imports_only_leaves():
    tree = ast.parse(Path(lifecycle.__file__).read_text())
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    project = {name for name in imported if name.startswith("django")}
    assert project <= {
        "django_jobs",
        "django_jobs.attempts",
        "django_jobs.exceptions",
        "django_jobs.limits",
    }


def test_schedule_specifications_import_no_models_and_no_worker():
    tree = ast.parse(Path(lifecycle.__file__).with_name("schedules.py").read_text())
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not {"django_jobs.models", "django_jobs.api", "django.db"} & imported
    assert not any(name.startswith("django_jobs.worker") for name in imported)
