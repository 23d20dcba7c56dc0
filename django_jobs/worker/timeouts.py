"""Handlers that outlive their timeout: abandoned runs keep their job, thread and slots.

A thread cannot be killed. At a run's deadline its attempt has failed with
TimeoutError and ctx.cancelled is set, but the handler may run on. So the run
stays in flight until the handler returns: its executor thread is not replaced
(threads and connections stay within concurrency + 2), it counts against the
handler's `concurrency` in this worker, and its job stays leased, the heartbeat
extending the lease, which is what `global_concurrency` counts across the fleet
and what keeps another worker from running the job meanwhile. When it returns
(or the worker exits, which ends it), the TimeoutError is settled as the
lifecycle says (a retry, or a dead letter); what the handler returned or
committed late is discarded. When abandoned handlers hold every thread, the
worker gives them the grace period to return, then stops claiming and exits:
Worker.run() raises HandlersStuck and runjobs exits with EXIT_STUCK
(docs/worker.md#timeouts).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from django_jobs.lifecycle import Failed, Outcome, SettledAtomically
from django_jobs.rows import ClaimedJob
from django_jobs.worker.eventloop import LoopExecutor
from django_jobs.worker.runs import EXIT_STUCK, Run, WorkerStats, log_extra

logger = logging.getLogger("django_jobs.worker")


class Timeouts:
    """The timeout side of Worker (a mixin); the dispatcher loop calls _expire_timeouts.

    It keeps _abandoned, _stuck_threads and _all_stuck, and uses only: id,
    concurrency, grace, stats, _inflight, _timed, _held_back, _to_release,
    _stopping, _forget, _settle and _failure.
    """

    id: str
    concurrency: int
    async_concurrency: int
    _stuck_what = "all handler thread(s) are"  # what _stuck_for_good found stuck
    grace: float
    stats: WorkerStats
    _inflight: set[Run]
    _timed: set[Run]
    _held_back: deque[Run]
    _to_release: list[Run]
    _stopping: bool
    # In-flight runs whose handler outlived its timeout: the outcome (a TimeoutError)
    # to settle once it returns, and when it was abandoned (monotonic).
    _abandoned: dict[Run, tuple[Outcome, float]]
    _stuck_threads: set[threading.Thread]  # their threads, not waited for at shutdown
    _all_stuck: str | None  # every thread was abandoned: why run() raises HandlersStuck
    _eventloop: LoopExecutor | None  # the async handlers' executor

    def _forget(self, run: Run) -> None:
        raise NotImplementedError

    def _settle(self, run: Run, outcome: Outcome, duration: float) -> None:
        raise NotImplementedError

    def _failure(self, job: ClaimedJob, exc: BaseException, fatal: bool = False) -> Failed:
        raise NotImplementedError

    def _due_at(self, run: Run, now: float) -> float | None:
        """When run's timeout passes, as far as is known now (a blocked loop's time excused)."""
        deadline = run.deadline
        if deadline is None or not run.on_loop:
            return deadline
        excuse = self._excuse(run, now)
        return max(deadline + excuse, now + 0.02) if excuse else deadline

    def _excuse(self, run: Run, now: float) -> float:
        loop = self._eventloop
        return loop.excuse(run, now) if run.on_loop and loop is not None else 0.0

    def _interrupt(self, run: Run) -> None:
        if self._eventloop is not None:
            self._eventloop.cancel(run)

    def _loop_blocker(self) -> Run | None:
        loop = self._eventloop
        return loop.loop_blocker() if loop is not None and loop.started else None

    def _running_on(self) -> bool:
        """Whether a run in flight may still report: not abandoned, or within grace of it."""
        if len(self._inflight) > len(self._abandoned):
            return True
        now = time.monotonic()
        return any(now < at + self.grace for _, at in self._abandoned.values())

    def _stuck_for_good(self, now: float) -> bool:
        """Whether abandoned handlers have held every thread (or the loop) for the grace period.

        For async handlers that is every loop slot, or the loop itself: a handler
        past its timeout that blocks the loop (it never awaits) holds them all.
        """
        threads = [at for run, (_, at) in self._abandoned.items() if not run.on_loop]
        if len(threads) >= self.concurrency and now >= max(threads) + self.grace:
            self._stuck_what = f"all {self.concurrency} handler thread(s) are"
            return True
        slots = [at for run, (_, at) in self._abandoned.items() if run.on_loop]
        if slots and len(slots) >= self.async_concurrency and now >= max(slots) + self.grace:
            self._stuck_what = f"all {self.async_concurrency} event loop slot(s) are"
            return True
        blocker = self._loop_blocker()
        if blocker is not None and blocker in self._abandoned:
            if now >= self._abandoned[blocker][1] + self.grace:
                self._stuck_what = "the event loop of async handlers is"
                return True
        return False

    def _expire_timeouts(self, now: float) -> None:
        """Abandon the runs past their deadline: their attempts failed with TimeoutError."""
        for run in [
            run for run in self._timed if (d := run.deadline) and now >= d + self._excuse(run, now)
        ]:
            job = run.job
            self._timed.discard(run)
            run.abandoned = run.timed_out = True
            assert run.ctx is not None  # a run handed out has one
            run.ctx.cancel()
            exc = TimeoutError(f"handler ran longer than its {run.timeout:g}s timeout")
            self._abandoned[run] = (self._failure(job, exc), now)
            self.stats.abandoned = len(self._abandoned)
            if run.on_loop:
                self._interrupt(run)
                logger.warning(
                    "job %s[%s] attempt %d: its async handler ran past its %gs timeout "
                    "(TimeoutError): its task is cancelled; until it ends, the job stays "
                    "leased and holds its slot on the event loop",
                    job.name,
                    job.id,
                    job.attempts,
                    run.timeout,
                    extra=log_extra(job),
                )
                self._release_capped(run)
                continue
            if run.thread is not None:
                self._stuck_threads.add(run.thread)
            abandoned = sum(1 for r in self._abandoned if not r.on_loop)
            every = abandoned >= self.concurrency
            logger.warning(
                "job %s[%s] attempt %d: its handler ran past its %gs timeout (TimeoutError; "
                "ctx.cancelled is set). Until it returns, the job stays leased and holds its "
                "thread and slots: %d of %d thread(s) abandoned%s",
                job.name,
                job.id,
                job.attempts,
                run.timeout,
                abandoned,
                self.concurrency,
                f"; the worker exits unless one returns within {self.grace:g}s" if every else "",
                extra=log_extra(job),
            )
            self._release_capped(run)

    def _release_capped(self, run: Run) -> None:
        """Give back the held-back jobs of run's handler if abandoned runs fill its cap.

        They could wait as long as the stuck handler runs; another worker may run
        them now (this one claims none of them while the cap is full).
        """
        cap = run.handler.concurrency if run.handler is not None else None
        name = run.job.name
        stuck = sum(1 for r in self._abandoned if r.job.name == name)
        if not cap or stuck < cap or not self._held_back:
            return
        waiting = [r for r in self._held_back if r.job.name == name]
        for held in waiting:
            self._held_back.remove(held)
        self._to_release.extend(waiting)

    def _returned(self, run: Run, reported: Outcome, took: float) -> None:
        """An abandoned handler returned: settle its TimeoutError, free its thread and slots."""
        outcome, at = self._abandoned.pop(run)
        self._stuck_threads.discard(run.thread)
        self.stats.abandoned = len(self._abandoned)
        if type(reported) is SettledAtomically:
            # Its transaction passed the abandoned check just before the deadline and
            # committed its marker: the work is done, and the row is gone.
            outcome = reported
        logger.warning(
            "job %s[%s] attempt %d: its abandoned handler returned after %.1fs; %s",
            run.job.name,
            run.job.id,
            run.job.attempts,
            took,
            "it had committed" if outcome is reported else "what it returned is discarded",
            extra=log_extra(run.job),
        )
        self._forget(run)
        self._settle(run, outcome, at - run.started)

    def _stuck_list(self) -> str:
        now = time.monotonic()
        return ", ".join(
            f"{run.job.name}[{run.job.id}] for {now - run.started:.1f}s" for run in self._abandoned
        )

    def _give_up_stuck(self) -> None:
        """Every thread runs an abandoned handler: stop claiming, to exit for a restart."""
        self._all_stuck = (
            f"{self._stuck_what} stuck in handlers past their "
            f"timeout and the {self.grace:g}s grace: {self._stuck_list()}"
        )
        logger.error(
            "worker %s: %s. It stops claiming, records those attempts as timed out and "
            "exits (runjobs: exit code %d) for its supervisor to restart it",
            self.id,
            self._all_stuck,
            EXIT_STUCK,
        )
        self._stopping = True

    def _settle_abandoned(self) -> None:
        """At exit: settle the TimeoutError of each handler still running; it dies with us."""
        if not self._abandoned:
            return
        if self._all_stuck is None:
            logger.warning(
                "worker %s: exiting with %d handler(s) still running past their timeout: %s; "
                "their attempts are recorded as timed out",
                self.id,
                len(self._abandoned),
                self._stuck_list(),
            )
        for run, (outcome, at) in list(self._abandoned.items()):
            del self._abandoned[run]
            self._forget(run)
            self._settle(run, outcome, at - run.started)
        self.stats.abandoned = 0
