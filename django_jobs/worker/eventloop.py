"""The event loop: a worker's async handlers run as tasks on one loop thread.

The dispatcher hands a run over with ``submit`` and gets its Finished report
on its inbox, exactly as from an executor thread; the loop runs up to
``slots`` handlers at once and queues the rest. What the attempt's outcome is
comes from django_jobs.worker.attempt, as for the threads.

- **Timeouts cancel for real**: ``cancel`` cancels the run's task; a handler
  that swallows the CancelledError runs on, abandoned, holding its slot, as a
  sync handler holds its thread (django_jobs.worker.timeouts).
- **A blocked loop is found**: a tick on the loop notes every TICK that the
  loop is responsive; a watchdog thread notices when it has not been for SLOW
  seconds and logs the handler that holds it (named from the loop thread's
  stack). The stalled time does not count against the other runs' timeouts
  (``excuse`` and Run.excused); the blocking handler's own timeout counts it.
- **The ORM from async handlers**: ``sync_to_async`` calls of handlers on this
  loop (thread-sensitive or not) run on one bounded pool of threads of the
  worker, each with its own connections kept across calls and tidied after
  each, instead of asgiref's single shared thread.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, cast

from asgiref.sync import AsyncToSync
from django.db import connections

from django_jobs import lifecycle, tracing
from django_jobs.attempts import type_name
from django_jobs.exceptions import JobCancelled
from django_jobs.worker import attempt
from django_jobs.worker.executor import close_connections, tidy_connections
from django_jobs.worker.runs import Finished, Run, log_extra

logger = logging.getLogger("django_jobs.worker")

# The loop notes it is responsive this often; a handler that holds it longer than
# SLOW (asyncio's own slow_callback_duration) is logged, and others are excused.
TICK = 0.02
SLOW = 0.1


class _OrmPool(ThreadPoolExecutor):
    """The threads that run the loop's sync_to_async calls (at most `size`, started as needed).

    Each thread keeps its connections across calls, tidied after each, and
    closes them when the pool shuts down.
    """

    def __init__(self, size: int) -> None:
        super().__init__(max_workers=1)  # asyncio wants one; its own threads are never started
        self._size = size
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._serving: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._calls.put((future, fn, args, kwargs))
        with self._lock:
            if self._idle:
                self._idle -= 1
                return future
            if len(self._serving) >= self._size:
                return future
            thread = threading.Thread(
                target=self._serve, name=f"django-jobs-orm-{len(self._serving)}", daemon=True
            )
            self._serving.append(thread)
        thread.start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for _ in self._serving:
            self._calls.put(None)
        if wait:
            for thread in self._serving:
                thread.join(timeout=2.0)

    def _serve(self) -> None:
        try:
            while (call := self._calls.get()) is not None:
                future, fn, args, kwargs = call
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn(*args, **kwargs))
                    except BaseException as exc:  # noqa: BLE001 - the caller awaits it
                        future.set_exception(exc)
                    own = list(connections.all(initialized_only=True))
                    try:
                        tidy_connections(own)
                    except BaseException:  # noqa: BLE001 - a handler can leave any state
                        close_connections(own)
                with self._lock:
                    self._idle += 1
        finally:
            connections.close_all()


async def attempt_in_task(run: Run, worker_id: str) -> Finished:
    """Await run's async handler in the running task and return its report; never raise.

    The worker's loop runs each job in a task of its own; drain() awaits one at a
    time (django_jobs.worker.inline). A cancel of the task (a timeout, a shutdown,
    an operator's cancel) ends the handler, reported as stopped.
    """
    run.started = time.monotonic()
    try:
        # In its span, when tracing is on.
        outcome = await tracing.aattempt(lambda r: attempt.aoutcome_of(r, worker_id), run)
    except asyncio.CancelledError as exc:  # the worker's own cancellation
        # At a timeout or a release the dispatcher has recorded why it cancelled, and
        # this report only says the task has ended; at an operator's cancel it is the
        # attempt's outcome (a dead letter as cancelled).
        stopped = JobCancelled(f"stopped: cancelled ({type_name(exc)} in the handler)")
        outcome = attempt.failure(run.job, stopped, worker_id)
    except BaseException as exc:  # noqa: BLE001 - a GeneratorExit the handler raised
        # The task throws a GeneratorExit raised below an await (a sync_to_async call's)
        # into this, its outermost frame, past the handler's and aoutcome_of's.
        outcome = attempt.failure(run.job, exc, worker_id)
    if run.ctx is not None:
        run.ctx.flush_progress()  # its last value, written before the settle (same inbox)
    return Finished(run, outcome, time.monotonic() - run.started)


class LoopExecutor:
    """Run async handlers as tasks on one event loop thread; report each as a thread does."""

    def __init__(
        self,
        *,
        slots: int,
        orm_threads: int,
        worker_id: str,
        report: Callable[[Finished], None],
    ) -> None:
        self.slots = slots
        self._orm_threads = orm_threads
        self._worker_id = worker_id
        self._report = report
        self._incoming: deque[Run] = deque()  # from the dispatcher, taken on the loop
        self._waiting: deque[Run] = deque()  # loop thread only: beyond the slots
        self._running: set[Run] = set()  # loop thread only
        self._wake_lock = threading.Lock()
        self._wake_pending = False
        self._draining = False
        self._closing = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        self._pool: _OrmPool | None = None
        # When the loop last showed it was responsive, and the run found holding it since.
        self.last_tick = 0.0
        self.blocker: Run | None = None

    @property
    def started(self) -> bool:
        return self._loop is not None

    def threads(self) -> list[threading.Thread]:
        """The threads this executor started (the loop, its watchdog)."""
        return [t for t in (self._thread, self._watchdog) if t is not None]

    # ---- from the dispatcher ------------------------------------------------

    def start(self) -> None:
        loop = asyncio.new_event_loop()
        pool = _OrmPool(self._orm_threads)
        loop.set_default_executor(pool)
        # asgiref sends thread-sensitive calls from a loop it finds here to that executor
        # (its own async_to_sync registers its loops the same way).
        AsyncToSync.loop_thread_executors[loop] = cast("Any", pool)
        self._loop, self._pool = loop, pool
        self.last_tick = time.monotonic()
        self._thread = threading.Thread(target=self._main, name="django-jobs-loop", daemon=True)
        self._watchdog = threading.Thread(
            target=self._watch, name="django-jobs-loop-watchdog", daemon=True
        )
        self._thread.start()
        self._watchdog.start()

    def submit(self, run: Run) -> None:
        """Queue run for the loop (any thread); it starts when a slot is free."""
        if self._loop is None:
            self.start()
        self._incoming.append(run)
        with self._wake_lock:
            if self._wake_pending:
                return
            self._wake_pending = True
        self._call(self._take)

    def cancel(self, run: Run) -> None:
        """Cancel run's task (its timeout passed, or the worker gives up on it)."""
        self._call(self._cancel_task, run)

    def drain(self) -> None:
        """Hand back the runs not started yet, and those submitted from now on, unstarted."""
        self._call(self._drain)

    def excuse(self, run: Run, now: float) -> float:
        """Seconds of run's time lost to a loop blocked right now by another handler."""
        stalled = now - self.last_tick - TICK
        return stalled if stalled > 0 and run is not self.blocker else 0.0

    def loop_blocker(self) -> Run | None:
        """The run blocking the loop now, once the watchdog has found it."""
        return self.blocker if time.monotonic() - self.last_tick > SLOW + TICK else None

    def shutdown(self, timeout: float) -> None:
        """Cancel what still runs and stop the loop; wait at most timeout for the thread."""
        self._closing.set()
        if self._loop is None or self._thread is None:
            return
        self._call(self._stop)
        self._thread.join(timeout)

    def _call(self, callback: Callable[..., Any], *args: Any) -> None:
        loop = self._loop
        assert loop is not None  # started
        try:
            loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: the worker is exiting
            pass

    # ---- on the loop --------------------------------------------------------

    def _main(self) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        ticker = loop.create_task(self._tick())
        try:
            loop.run_forever()
        finally:
            ticker.cancel()
            AsyncToSync.loop_thread_executors.pop(loop, None)
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            loop.run_until_complete(asyncio.sleep(0))  # let the ticker end
            loop.close()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            now = time.monotonic()
            stalled = now - self.last_tick - TICK
            if stalled > SLOW:
                blocker = self.blocker
                for run in self._running:
                    if run is not blocker:
                        run.excused += stalled
                if blocker is not None:
                    logger.warning(
                        "job %s[%s]: its async handler gave the event loop back after "
                        "blocking it for %.2fs",
                        blocker.job.name,
                        blocker.job.id,
                        stalled,
                        extra=log_extra(blocker.job),
                    )
            self.blocker = None
            self.last_tick = now

    def _take(self) -> None:
        with self._wake_lock:
            self._wake_pending = False
        while self._incoming:
            self._waiting.append(self._incoming.popleft())
        self._fill()

    def _fill(self) -> None:
        loop = self._loop
        assert loop is not None
        while self._waiting and (self._draining or len(self._running) < self.slots):
            run = self._waiting.popleft()
            if self._draining:
                self._report(Finished(run, lifecycle.Unstarted(), 0.0))
                continue
            self._running.add(run)
            # The attempt is the task's outermost coroutine: a GeneratorExit raised under
            # an await is thrown into that frame, which catches it (attempt_in_task).
            run.task = task = loop.create_task(attempt_in_task(run, self._worker_id))
            task.add_done_callback(partial(self._ended, run))

    def _ended(self, run: Run, task: asyncio.Task[Finished]) -> None:
        self._running.discard(run)
        run.task = None
        if task.cancelled():  # cancelled before its first step: the handler never started
            stopped = JobCancelled("stopped: cancelled before its handler started")
            finished = Finished(run, attempt.failure(run.job, stopped, self._worker_id), 0.0)
        else:
            finished = task.result()  # attempt_in_task never raises
        self._report(finished)
        if self._waiting:
            self._fill()

    def _cancel_task(self, run: Run) -> None:
        task = run.task
        if task is not None:
            task.cancel()

    def _drain(self) -> None:
        self._draining = True
        self._take()

    def _stop(self) -> None:
        loop = self._loop
        assert loop is not None
        self._draining = True
        self._take()
        tasks = [run.task for run in self._running if run.task is not None]
        for task in tasks:
            task.cancel()
        if not tasks:
            loop.stop()
            return
        waiting = loop.create_task(asyncio.wait(tasks, timeout=1.0))
        waiting.add_done_callback(lambda _: loop.stop())

    # ---- the watchdog thread ----------------------------------------------------

    def _watch(self) -> None:
        told = 0.0  # the tick of the stall last logged
        while not self._closing.wait(TICK):
            since = self.last_tick
            held = time.monotonic() - since - TICK
            if held <= SLOW or since == told:
                continue
            told = since
            run, where = self._holder()
            self.blocker = run
            if run is None:
                logger.warning(
                    "worker %s: the event loop of async handlers has been blocked for %.2fs%s",
                    self._worker_id,
                    held,
                    where,
                )
                continue
            logger.warning(
                "job %s[%s]: its async handler has blocked the event loop for %.2fs%s; "
                "the worker's other async jobs wait meanwhile (their timeouts do not count "
                "it). Await instead (asyncio.sleep, an async client), or make the handler "
                "a plain def to run it on a thread",
                run.job.name,
                run.job.id,
                held,
                where,
                extra=log_extra(run.job),
            )

    def _holder(self) -> tuple[Run | None, str]:
        """The run whose handler is on the loop thread's stack now, and where it is."""
        thread = self._thread
        frame = sys._current_frames().get(thread.ident) if thread and thread.ident else None
        top = frame
        while frame is not None:
            if frame.f_code is _ATTEMPT_CODE:
                found = frame.f_locals.get("run")
                where = f" (at {top.f_code.co_filename}:{top.f_lineno})" if top else ""
                return (found if isinstance(found, Run) else None), where
            frame = frame.f_back
        return None, ""


_ATTEMPT_CODE = attempt_in_task.__code__
