"""How many jobs a worker holds: its threads and its event loop, each with a look-ahead.

The dispatcher asks Slots how many jobs to claim and whether to claim now; it
tells it what it hands out and what finishes. Sync handlers run on the
threads, async ones on the loop (django_jobs.worker.eventloop); each kind has
its own target: its concurrency plus a short look-ahead sized from how long its
jobs take, so that short jobs are queued ahead and long ones only as slots free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django_jobs.worker.runs import Run

# How much work to queue beyond free slots: enough to keep them busy this long.
LOOKAHEAD = 0.02


class Slots:
    """The worker's capacity, per kind of handler (threads, loop)."""

    def __init__(self, *, threads: int, loop: int, batch: int, loop_enabled: bool = True) -> None:
        self.threads, self.loop, self.batch = threads, loop, batch
        self.loop_enabled = loop_enabled
        self.target = threads  # in-flight jobs to aim for on the threads
        self.loop_target = loop
        self.on_loop = 0  # runs handed to the loop and not finished
        self._avg: float | None = None
        self._avg_loop: float | None = None
        self.thread_names: list[str] = []
        self.loop_names: list[str] = []
        # The kinds whose last claim came back short: none of their jobs was left due,
        # so claims leave them out until a look everywhere (a poll, a wake-up).
        self._quiet: set[str] = set()

    def split(self, names: Iterable[str], handlers: Mapping[str, Any]) -> None:
        """Tell the names whose handlers run on the loop from those the threads run."""
        thread_names: list[str] = []
        loop_names: list[str] = []
        for name in names:
            handler = handlers.get(name)
            async_ = handler is not None and handler.is_async and not handler.atomic
            (loop_names if async_ and self.loop_enabled else thread_names).append(name)
        self.thread_names, self.loop_names = thread_names, loop_names

    def runs_on_loop(self, handler: Any) -> bool:
        return self.loop_enabled and handler.is_async and not handler.atomic

    def finished(self, run: Run, duration: float) -> None:
        """Count a finished run's duration into its kind's look-ahead."""
        if run.on_loop:
            avg = self._avg_loop
            self._avg_loop = avg = duration if avg is None else 0.9 * avg + 0.1 * duration
            self.loop_target = self.loop + min(
                self.batch, int(self.loop * LOOKAHEAD / max(avg, 1e-6))
            )
        else:
            avg = self._avg
            self._avg = avg = duration if avg is None else 0.9 * avg + 0.1 * duration
            self.target = self.threads + min(
                self.batch, int(self.threads * LOOKAHEAD / max(avg, 1e-6))
            )

    def free_by_kind(self, inflight: int, held_back: Iterable[Run]) -> tuple[int, int]:
        """Free slots (look-ahead included) on the threads and on the loop."""
        held = held_loop = 0
        for run in held_back:
            held += 1
            held_loop += run.on_loop
        free_threads = free_loop = 0
        if self.thread_names:
            free_threads = self.target - (inflight - self.on_loop) - (held - held_loop)
        if self.loop_names:
            free_loop = self.loop_target - self.on_loop - held_loop
        return max(0, free_threads), max(0, free_loop)

    def free(self, inflight: int, held_back: Any) -> int:
        """Free slots of both kinds (not capped by the batch size)."""
        if not self.loop_names:  # the common case, kept short: threads only
            return self.target - inflight - len(held_back)
        return sum(self.free_by_kind(inflight, held_back))

    def claim_now(self, free: int, inflight: int) -> bool:
        """Whether to claim free jobs now, rather than wait for more to be free.

        At once when threads (or loop slots) would idle; otherwise once half the
        look-ahead is free, rather than claiming a job at a time.
        """
        if not self.loop_names:
            return inflight < self.threads or free >= self.target // 2
        idle_threads = bool(self.thread_names) and inflight - self.on_loop < self.threads
        target = (self.target if self.thread_names else 0) + self.loop_target
        return idle_threads or self.on_loop < self.loop or free >= target // 2

    def shares(
        self, names: list[str], asked: int, inflight: int, held_back: Any, excluded: set[str]
    ) -> list[ClaimShare]:
        """How a claim of up to `asked` jobs of names is made: one statement per kind.

        With both kinds, each kind is claimed by a statement of its own, up to its own
        free slots (one for both could bring the loop's free count of sync jobs, queued
        behind the threads past their leases). A kind without room, or quiet (its last
        claim came back short) while the other is not, is left out (added to excluded);
        a look everywhere (wake) makes every wake-up look at both again.
        """
        if not (self.loop_names and self.thread_names):
            return [ClaimShare(names, asked, THREADS)]
        free_threads, free_loop = self.free_by_kind(inflight, held_back)
        if len(self._quiet) == 1:  # the other kind alone, while it finds jobs
            if THREADS in self._quiet:
                free_threads = 0
            else:
                free_loop = 0
        on_loop = set(self.loop_names)  # filtered from names: what the burst check asks
        threads = ClaimShare(
            [n for n in names if n not in on_loop], min(asked, free_threads), THREADS
        )
        loop = ClaimShare(
            [n for n in names if n in on_loop], min(asked - threads.limit, free_loop), LOOP
        )
        if not threads.limit:
            excluded.update(self.thread_names)
        if not loop.limit:
            excluded.update(self.loop_names)
        return [share for share in (threads, loop) if share.limit] or [threads]  # or: beat only

    def claimed(self, shares: list[ClaimShare], got: list[int]) -> bool:
        """Note which kinds' claims came back short; say whether one came back full.

        A full share may have left jobs due: the dispatcher claims again at once. A
        short one found none left: that kind is quiet until the next wake().
        """
        full = False
        for share, count in zip(shares, got, strict=True):
            if count >= share.limit:
                full = True
                self._quiet.discard(share.kind)
            else:
                self._quiet.add(share.kind)
        return full

    def wake(self) -> None:
        """A poll or a wake-up: the next claim looks at both kinds again."""
        self._quiet.clear()


THREADS, LOOP = "threads", "loop"


@dataclass(frozen=True, slots=True)
class ClaimShare:
    """One claim statement: up to limit jobs of these names, for one kind of handler."""

    names: list[str]
    limit: int
    kind: str = THREADS
