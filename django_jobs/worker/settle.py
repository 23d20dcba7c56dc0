"""Settling: carry out the transition the lifecycle decides for each outcome.

Successes are settled in batches (delete + marker in one statement); everything
else one job at a time through the store's named methods (retry, dead_letter,
snooze). A settle that meets a connection error is kept and tried again; one the
database refuses is itself an outcome for the lifecycle to decide on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from django_jobs import conf, lifecycle, signals
from django_jobs.attempts import DeadReason, error_entry, error_summary
from django_jobs.lifecycle import Outcome
from django_jobs.registry import Backoff
from django_jobs.rows import ClaimedJob, Finished, Settled
from django_jobs.store import JobStore
from django_jobs.worker.runs import Run, WorkerStats, log_extra, traceback_tail

logger = logging.getLogger("django_jobs.worker")

_Succeeded = lifecycle.Succeeded
_FENCED = object()  # a settle found the row leased to another worker


def finished_of(
    batch: list[tuple[Run, str | None, float]],
) -> list[Finished]:
    """Return what the store settles a batch of successes by."""
    return [
        Finished(run.job.id, run.job.token, result, run.job.dependents) for run, result, _ in batch
    ]


class _DefaultPolicy:
    """The policy of a job settled without its handler (the settings' backoff)."""

    def get_backoff(self) -> Backoff:
        return Backoff.coerce(conf.get("BACKOFF"))


_DEFAULT_POLICY = _DefaultPolicy()


class DbRefused:
    """The database refused a settle's statement (not a connection error): exc says why."""

    __slots__ = ("exc",)

    def __init__(self, exc: Exception) -> None:
        self.exc = exc


class SettleHost(Protocol):
    """What Settler asks of its worker: its id and counters, its database access, two calls."""

    id: str
    stats: WorkerStats

    def guarded(self, operation: Callable[[], Any], *, settle: bool = False) -> Any:
        """Run operation on the worker's connection (None: database away; DbRefused)."""
        ...

    def claim_soon(self) -> None:
        """Jobs are due now (a retry without delay, released dependents): claim at once."""
        ...

    def reported(self, job: ClaimedJob, outcome: str, error: Any, duration: float | None) -> None:
        """An attempt ended: succeeded, retried, dead or snoozed (the worker's counters)."""
        ...


class Settler:
    """Carry out the lifecycle's transitions through the store, for one worker.

    The dispatcher calls settle() for each outcome and flush() for the batch of
    successes (`done`); it retries `unsettled` (settles that met a connection
    error) with retry_unsettled() and gives back `to_release`. The settler sees
    the worker only through SettleHost.
    """

    def __init__(self, host: SettleHost, store: JobStore) -> None:
        self.host = host
        self.id = host.id
        self.stats = host.stats
        self._store = store
        self.done: list[tuple[Run, str | None, float]] = []  # successes, settled together
        self.done_since = 0.0  # when the first of them was added (monotonic)
        self.unsettled: list[tuple[Run, Outcome, float]] = []  # settles that hit a DB error
        self.to_release: list[Run] = []  # runs to give back, attempt not counted

    def settle(self, run: Run, outcome: Outcome, duration: float) -> None:
        """Ask the lifecycle what outcome leads to, and carry it out."""
        if type(outcome) is _Succeeded:
            # The hot path: the lifecycle's answer to a success is always
            # Complete(result) (tests/test_lifecycle.py pins it); batch it at once.
            if not self.done:
                self.done_since = time.monotonic()
            self.done.append((run, outcome.result, duration))
            return
        transition = lifecycle.on_outcome(
            run.job,
            outcome,
            policy=run.handler or _DEFAULT_POLICY,
            cancel_requested=run.cancel_requested,
        )
        self.carry_out(run, transition, duration, outcome)

    def carry_out(
        self,
        run: Run,
        transition: lifecycle.Transition,
        duration: float,
        outcome: Outcome | None = None,
    ) -> None:
        """Execute transition through the store; outcome is kept to settle again later."""
        job = run.job
        if isinstance(transition, lifecycle.Complete):
            if transition.skipped:
                self.stats.skipped += 1
                if isinstance(outcome, lifecycle.AlreadyDone):
                    logger.warning(
                        "job %s: its key was completed by another attempt; effects rolled back",
                        job.id,
                        extra=log_extra(job),
                    )
            if not self.done:
                self.done_since = time.monotonic()
            self.done.append((run, transition.result, duration))
        elif isinstance(transition, lifecycle.Retry):
            self._retry(run, transition, duration, outcome)
        elif isinstance(transition, lifecycle.DeadLetter):
            error = self._entry(transition.error, job)
            if transition.drop_last_error:
                job.errors = job.errors[:-1] if job.errors else []
            written = self._dead_letter(
                job, transition.reason, error, attempts=transition.attempts, exc=transition.exc
            )
            if written is None and outcome is not None:
                # (A letter decided at claim is not kept: the lease brings the job back.)
                self.unsettled.append((run, outcome, duration))
            elif written and transition.reason == DeadReason.CANCELLED:
                self.stats.cancelled += 1
        elif isinstance(transition, lifecycle.SnoozeFor):
            self._snooze(run, transition, duration, outcome)
        elif isinstance(transition, lifecycle.Completed):
            if job.dependents:
                self.host.claim_soon()  # its settle may have made its dependents due
            self.stats.succeeded += 1
            logger.debug("job %s succeeded (atomic)", job.id, extra=log_extra(job))
            self._send_finished(job, "succeeded", None, duration)
        elif isinstance(transition, lifecycle.Abandon):
            self.stats.lost += 1
            logger.warning(
                "job %s: lease lost to another worker; this attempt was rolled back",
                job.id,
                extra=log_extra(job),
            )
        elif isinstance(transition, lifecycle.Release):
            self.to_release.append(run)
        elif isinstance(transition, lifecycle.Interrupt):
            assert run.ctx is not None  # only a running job is interrupted
            run.ctx.cancel()
            logger.warning(
                "job %s[%s]: cancellation requested; ctx.cancelled is set",
                job.name,
                job.id,
                extra=log_extra(job),
            )

    def _entry(
        self, error: dict[str, Any] | lifecycle.Cause | BaseException, job: ClaimedJob
    ) -> dict[str, Any]:
        """Return the error entry a transition carries, described or written down."""
        if isinstance(error, dict):
            return error
        if isinstance(error, BaseException):
            return error_entry(job.attempts, exc=error, worker=self.id)
        return error_entry(
            error.attempt,
            kind=error.kind,
            message=error.message,
            traceback=error.traceback,
            worker=self.id if error.worker is None else error.worker,
        )

    def _snooze(
        self, run: Run, transition: lifecycle.SnoozeFor, duration: float, outcome: Any
    ) -> None:
        job = run.job
        ok = self.host.guarded(
            lambda: self._store.snooze(job, delay=transition.seconds), settle=True
        )
        if ok is None:
            self.unsettled.append((run, outcome, duration))
        elif isinstance(ok, DbRefused):
            self.settle(run, self._refused("snooze", job, ok.exc), duration)
        elif ok:
            self.stats.snoozed += 1
            if transition.seconds <= 0:
                self.host.claim_soon()
            logger.info(
                "job %s snoozed for %.1fs (attempt not counted)",
                job.id,
                transition.seconds,
                extra=log_extra(job),
            )
            self._send_finished(job, "snoozed", None, duration)
        else:
            self._note_fenced(job)

    def _retry(self, run: Run, transition: lifecycle.Retry, duration: float, outcome: Any) -> None:
        job = run.job
        delay, error = transition.delay, transition.error
        ok = self.host.guarded(
            lambda: self._store.retry(job, delay=delay, error=error), settle=True
        )
        if ok is None:
            self.unsettled.append((run, outcome, duration))
        elif isinstance(ok, DbRefused):
            refused = lifecycle.Refused(
                "retry",
                error_entry(job.attempts, exc=ok.exc, worker=self.id),
                original=error,
                exc=transition.exc,
            )
            self.settle(run, refused, duration)
        elif ok:
            self.stats.retried += 1
            if delay <= 0:
                self.host.claim_soon()
            logger.warning(
                "job %s[%s] attempt %d/%d failed (%s); retrying in %.1fs%s",
                job.name,
                job.id,
                job.attempts,
                job.max_attempts,
                error_summary(error),
                delay,
                traceback_tail(error) if logger.isEnabledFor(logging.DEBUG) else "",
                extra=log_extra(job),
            )
            self._send_finished(job, "retried", transition.exc, duration)
        else:
            self._note_fenced(job)

    def _refused(self, step: str, job: ClaimedJob, exc: Exception) -> lifecycle.Refused:
        return lifecycle.Refused(step, error_entry(job.attempts, exc=exc, worker=self.id), exc=exc)

    def _dead_letter(
        self,
        job: ClaimedJob,
        reason: str,
        error: dict[str, Any],
        *,
        attempts: int | None = None,
        exc: BaseException | None = None,
    ) -> bool | None:
        """Move job to the dead letters: True if written, None to try again (database away)."""
        letter = self.host.guarded(
            lambda: (
                self._store.dead_letter(job, reason=reason, error=error, attempts=attempts)
                or _FENCED
            ),
            settle=True,
        )
        if letter is None:
            return None
        if letter is _FENCED:
            return False  # another worker holds it now: whoever settles it decides
        if isinstance(letter, DbRefused):
            # lifecycle: Abandon. Nothing this worker writes for the job is taken.
            logger.error(
                "job %s: its dead letter (%s) could not be written",
                job.id,
                reason,
                extra=log_extra(job),
            )
            return False
        self.stats.dead += 1
        # The stored (capped, storable) traceback, not exc_info: a 10 MB message
        # must not make a 10 MB log line, and a hostile exception cannot break logging.
        logger.error(
            "job %s[%s] dead-lettered (%s) after %d attempt(s): %s%s",
            job.name,
            job.id,
            reason,
            letter.attempts,
            error_summary(error),
            traceback_tail(error),
            extra=log_extra(job),
        )
        if signals.job_dead_lettered.receivers:
            signals.send(
                signals.job_dead_lettered,
                **signals.about(job),
                reason=reason,
                attempts=letter.attempts,
                error=letter.error,
            )
        self._send_finished(job, "dead", exc, None)
        return True

    def take_done(self) -> list[tuple[Run, str | None, float]]:
        """Hand over the batch of successes, for a statement that settles them (and claims)."""
        batch, self.done = self.done, []
        return batch

    def flush(self) -> None:
        """Settle the batch of successes (`done`) in one statement."""
        batch = self.take_done()
        settled = self.host.guarded(lambda: self._store.complete(finished_of(batch)), settle=True)
        self.completed(batch, settled)

    def completed(
        self, batch: list[tuple[Run, str | None, float]], settled: Settled | DbRefused | None
    ) -> None:
        """Carry on after the settle of batch: `settled` is the store's answer, or _db's."""
        if settled is None:
            # The database is away: settle one by one once it is back.
            self.unsettled.extend((run, _Succeeded(result), d) for run, result, d in batch)
        elif isinstance(settled, DbRefused):
            if len(batch) == 1:
                run, _, duration = batch[0]
                self.settle(run, self._refused("complete", run.job, settled.exc), duration)
                return
            # One row the database refuses must not fail the others: settle each alone.
            for run, result, duration in batch:
                self._complete_one(run, result, duration)
        else:
            if settled.woke:
                self.host.claim_soon()  # dependents of these jobs are due now
            for index, (run, _, duration) in enumerate(batch):
                if index in settled:
                    self._succeeded(run.job, duration)
                else:
                    self._note_fenced(run.job)

    def _complete_one(self, run: Run, result: str | None, duration: float) -> None:
        job = run.job
        settled = self.host.guarded(
            lambda: self._store.complete([Finished(job.id, job.token, result, job.dependents)]),
            settle=True,
        )
        if settled is None:
            self.unsettled.append((run, _Succeeded(result), duration))
        elif isinstance(settled, DbRefused):
            self.settle(run, self._refused("complete", job, settled.exc), duration)
        elif settled:
            if settled.woke:
                self.host.claim_soon()
            self._succeeded(job, duration)
        else:
            self._note_fenced(job)

    def _succeeded(self, job: ClaimedJob, duration: float) -> None:
        self.stats.succeeded += 1
        self._send_finished(job, "succeeded", None, duration)

    def retry_unsettled(self) -> None:
        pending, self.unsettled = self.unsettled, []
        for run, outcome, duration in pending:
            if isinstance(outcome, _Succeeded):
                self._complete_one(run, outcome.result, duration)
            else:
                self.settle(run, outcome, duration)

    def _note_fenced(self, job: ClaimedJob) -> None:
        self.stats.lost += 1
        logger.warning(
            "job %s: lease was taken over before this worker settled it; "
            "its late result is dropped",
            job.id,
            extra=log_extra(job),
        )

    def _send_finished(
        self, job: ClaimedJob, outcome: str, error: Any, duration: float | None
    ) -> None:
        self.host.reported(job, outcome, error, duration)
        # One line per outcome at runjobs' default verbosity (-v 1), as Celery and procrastinate.
        if logger.isEnabledFor(logging.INFO):
            extra = log_extra(job)
            extra["outcome"], extra["duration"] = outcome, duration
            if duration is None:
                logger.info(
                    "job %s[%s] attempt %d: %s",
                    job.name,
                    job.id,
                    job.attempts,
                    outcome,
                    extra=extra,
                )
            else:
                # "ran ...: retried", not "retried in ...": a run time, never a delay.
                logger.info(
                    "job %s[%s] attempt %d ran %.6fs: %s",
                    job.name,
                    job.id,
                    job.attempts,
                    duration,
                    outcome,
                    extra=extra,
                )
        if signals.job_finished.receivers:
            signals.send(
                signals.job_finished,
                **signals.about(job),
                attempt=job.attempts,
                outcome=outcome,
                error=error,
                duration=duration,
            )
