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

``Timeouts`` is an object of the worker's, which it sees only through
``TimeoutsHost`` (as upkeep sees it through ``UpkeepHost``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Protocol

from django_jobs.lifecycle import Outcome, SettledAtomically
from django_jobs.worker import attempt
from django_jobs.worker.eventloop import LoopExecutor
from django_jobs.worker.runs import EXIT_STUCK, Run, WorkerStats, log_extra

logger = logging.getLogger("django_jobs.worker")


class TimeoutsHost(Protocol):
    """What Timeouts reads of its worker: its options, the runs in flight, two hand-backs."""

    id: str
    concurrency: int
    async_concurrency: int
    grace: float
    stats: WorkerStats

    def running(self) -> int:
        """Return how many jobs the worker has handed to its executors."""
        ...

    def give_back_held(self, name: str) -> None:
        """Release the runs of job name the worker holds back (for another worker)."""
        ...

    def settle_late(self, run: Run, outcome: Outcome, duration: float) -> None:
        """Take run out of flight and settle outcome (an abandoned run's TimeoutError)."""
        ...


class Timeouts:
    """The runs in flight that have a timeout, and those that outlived it (the abandoned).

    The dispatcher adds a run with a timeout to `timed` when it hands it out and
    discards it when it finishes; it calls expire() each turn of its loop,
    returned() when an abandoned run reports, gave_up() to learn whether every
    thread is stuck, and settle_at_exit() when it stops.
    """

    def __init__(
        self,
        host: TimeoutsHost,
        stuck_threads: set[threading.Thread],
        eventloop: LoopExecutor | None,
    ) -> None:
        self.host = host
        self.worker_id = host.id
        self.concurrency = host.concurrency
        self.async_concurrency = host.async_concurrency
        self.grace = host.grace
        self.stats = host.stats
        self.timed: set[Run] = set()  # in-flight runs that have a timeout
        # In-flight runs whose handler outlived its timeout: the outcome (a TimeoutError)
        # to settle once it returns, and when it was abandoned (monotonic).
        self.abandoned: dict[Run, tuple[Outcome, float]] = {}
        self.stuck_threads = stuck_threads  # their threads, not waited for at shutdown
        self.all_stuck: str | None = None  # every thread was abandoned: why run() raises
        self.eventloop = eventloop  # the async handlers' executor, if any
        self._stuck_what = "all handler thread(s) are"  # what gave_up() found stuck

    def deadlines(self, now: float) -> Iterator[float]:
        """When the timed runs' timeouts pass, as far as is known now."""
        return (d for run in self.timed if (d := self._due_at(run, now)))

    def _due_at(self, run: Run, now: float) -> float | None:
        """When run's timeout passes, as far as is known now (a blocked loop's time excused)."""
        deadline = run.deadline
        if deadline is None or not run.on_loop:
            return deadline
        excuse = self._excuse(run, now)
        return max(deadline + excuse, now + 0.02) if excuse else deadline

    def _excuse(self, run: Run, now: float) -> float:
        loop = self.eventloop
        return loop.excuse(run, now) if run.on_loop and loop is not None else 0.0

    def _loop_blocker(self) -> Run | None:
        loop = self.eventloop
        return loop.loop_blocker() if loop is not None and loop.started else None

    def running_on(self) -> bool:
        """Whether a run in flight may still report: not abandoned, or within grace of it."""
        if self.host.running() > len(self.abandoned):
            return True
        now = time.monotonic()
        return any(now < at + self.grace for _, at in self.abandoned.values())

    def gave_up(self, now: float) -> bool:
        """Whether abandoned handlers have held every thread (or the loop) for the grace period.

        Then the worker stops claiming and exits for a restart (all_stuck says why).
        For async handlers that is every loop slot, or the loop itself: a handler
        past its timeout that blocks the loop (it never awaits) holds them all.
        """
        if not self.abandoned or not self._stuck_for_good(now):
            return False
        self.all_stuck = (
            f"{self._stuck_what} stuck in handlers past their "
            f"timeout and the {self.grace:g}s grace: {self._stuck_list()}"
        )
        logger.error(
            "worker %s: %s. It stops claiming, records those attempts as timed out and "
            "exits (runjobs: exit code %d) for its supervisor to restart it",
            self.worker_id,
            self.all_stuck,
            EXIT_STUCK,
        )
        return True

    def _stuck_for_good(self, now: float) -> bool:
        # By thread: the jobs of a chunk handler share one (worker/chunks.py).
        threads = {run.thread: at for run, (_, at) in self.abandoned.items() if not run.on_loop}
        if len(threads) >= self.concurrency and now >= max(threads.values()) + self.grace:
            self._stuck_what = f"all {self.concurrency} handler thread(s) are"
            return True
        slots = [at for run, (_, at) in self.abandoned.items() if run.on_loop]
        if slots and len(slots) >= self.async_concurrency and now >= max(slots) + self.grace:
            self._stuck_what = f"all {self.async_concurrency} event loop slot(s) are"
            return True
        blocker = self._loop_blocker()
        if blocker is not None and blocker in self.abandoned:
            if now >= self.abandoned[blocker][1] + self.grace:
                self._stuck_what = "the event loop of async handlers is"
                return True
        return False

    def expire(self, now: float) -> None:
        """Abandon the runs past their deadline: their attempts failed with TimeoutError."""
        for run in [
            run for run in self.timed if (d := run.deadline) and now >= d + self._excuse(run, now)
        ]:
            job = run.job
            self.timed.discard(run)
            run.abandoned = run.timed_out = True
            assert run.ctx is not None  # a run handed out has one
            run.ctx.cancel()
            exc = TimeoutError(f"handler ran longer than its {run.timeout:g}s timeout")
            self.abandoned[run] = (attempt.failure(job, exc, self.worker_id), now)
            self.stats.abandoned = len(self.abandoned)
            if run.on_loop or run.task is not None:  # a task (the loop's, or drain()'s)
                if self.eventloop is not None and run.on_loop:
                    self.eventloop.cancel(run)
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
                self.stuck_threads.add(run.thread)
            abandoned = len({r.thread for r in self.abandoned if not r.on_loop})
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
        if cap and sum(1 for r in self.abandoned if r.job.name == name) >= cap:
            self.host.give_back_held(name)

    def returned(self, run: Run, reported: Outcome, took: float) -> None:
        """An abandoned handler returned: settle its TimeoutError, free its thread and slots."""
        outcome, at = self.abandoned.pop(run)
        self.stuck_threads.discard(run.thread)
        self.stats.abandoned = len(self.abandoned)
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
        self.host.settle_late(run, outcome, at - run.started)

    def _stuck_list(self) -> str:
        now = time.monotonic()
        return ", ".join(
            f"{run.job.name}[{run.job.id}] for {now - run.started:.1f}s" for run in self.abandoned
        )

    def settle_at_exit(self) -> None:
        """At exit: settle the TimeoutError of each handler still running; it dies with us."""
        if not self.abandoned:
            return
        if self.all_stuck is None:
            logger.warning(
                "worker %s: exiting with %d handler(s) still running past their timeout: %s; "
                "their attempts are recorded as timed out",
                self.worker_id,
                len(self.abandoned),
                self._stuck_list(),
            )
        for run, (outcome, at) in list(self.abandoned.items()):
            del self.abandoned[run]
            self.host.settle_late(run, outcome, at - run.started)
        self.stats.abandoned = 0
