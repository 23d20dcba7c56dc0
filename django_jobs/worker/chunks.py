"""Chunk handlers' buffers: claimed jobs wait here until a chunk is full or has waited enough.

The dispatcher hands each claimed job of a ``@job(chunk=N)`` handler to ``Chunks``
instead of an executor. The job stays in flight meanwhile (its lease is extended
by the heartbeat, a cancel or a shutdown finds it there); once N jobs of the
handler are buffered, or ``chunk_wait`` seconds have passed since the first of
them arrived, they leave together as one ``ChunkRun`` for one executor thread.

A chunk holds one thread slot, however many jobs it has: ``discount`` is how many
of the worker's in-flight jobs the slot count leaves out. A running chunk counts as
one slot; buffered jobs count as none (at most N - 1 per handler wait), so that the
worker goes on claiming until its chunks fill.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django_jobs.registry import Handler
from django_jobs.worker.runs import ChunkRun, Run


@dataclass(slots=True)
class _Buffer:
    handler: Handler
    runs: list[Run] = field(default_factory=list)
    since: float = 0.0  # when the first of runs arrived (monotonic)


class Chunks:
    """The worker's chunk buffers, one per chunk handler, and the slots their jobs hold."""

    def __init__(self, *, submit: Callable[[ChunkRun], None]) -> None:
        self._submit = submit  # hands a chunk to the executor threads
        self._buffers: dict[str, _Buffer] = {}
        self._buffered = 0  # jobs waiting in the buffers
        self._chunk_of: dict[Run, ChunkRun] = {}  # each handed-out job still in flight: its chunk
        self._left: dict[ChunkRun, int] = {}  # each chunk handed out: its jobs still in flight
        self.pending = False  # whether any buffer holds a job

    def add(self, run: Run) -> None:
        """Buffer run (of a chunk handler); hand its chunk out when that fills it."""
        handler = run.handler
        assert handler is not None and handler.chunk is not None  # only chunk runs come here
        self._buffered += 1
        buffer = self._buffers.get(handler.name)
        if buffer is None:
            buffer = self._buffers[handler.name] = _Buffer(handler)
        if not buffer.runs:
            buffer.since = time.monotonic()
        buffer.runs.append(run)
        self.pending = True
        if len(buffer.runs) >= handler.chunk:
            self._submit(self._take(buffer))

    def left(self, run: Run) -> None:
        """A chunk run left the worker's flight (settled, released): free its share of a slot."""
        chunk = self._chunk_of.pop(run, None)
        if chunk is None:  # taken out of its buffer (remove, take_buffered): counted there
            return
        left = self._left[chunk] - 1
        if left:
            self._left[chunk] = left
        else:
            del self._left[chunk]

    @property
    def discount(self) -> int:
        """Chunk jobs in flight the slot count leaves out: the buffered, all but one per chunk."""
        return self._buffered + len(self._chunk_of) - len(self._left)

    def next_flush(self, now: float, *, everything: bool = False) -> float:
        """When the oldest partial chunk is due (monotonic; inf without one; now: everything)."""
        if not self.pending:
            return float("inf")
        if everything:
            return now
        return min(
            (b.since + b.handler.chunk_wait for b in self._buffers.values() if b.runs),
            default=float("inf"),
        )

    def hand_out_due(self, now: float, *, everything: bool = False) -> None:
        """Hand out the chunks that have waited their chunk_wait (every partial one: everything)."""
        for buffer in list(self._buffers.values()):
            if buffer.runs and (everything or now >= buffer.since + buffer.handler.chunk_wait):
                self._submit(self._take(buffer))

    def remove(self, run: Run, forget: Callable[[Run], None]) -> bool:
        """Take run out of its buffer if it waits there (a cancel), and forget it; True if so."""
        buffer = self._buffers.get(run.job.name)
        if buffer is None or run not in buffer.runs:
            return False
        buffer.runs.remove(run)
        self._buffered -= 1
        self.pending = any(b.runs for b in self._buffers.values())
        forget(run)
        return True

    def take_buffered(self, forget: Callable[[Run], None]) -> list[Run]:
        """Take (and forget) every buffered run: at shutdown they are released unstarted."""
        runs = [run for buffer in self._buffers.values() for run in buffer.runs]
        for buffer in self._buffers.values():
            buffer.runs = []
        self._buffered -= len(runs)
        self.pending = False
        for run in runs:
            forget(run)
        return runs

    def reset(self) -> None:
        """Forget every chunk run at once (the caller gives them all back)."""
        self._buffers.clear()
        self._buffered = 0
        self._chunk_of.clear()
        self._left.clear()
        self.pending = False

    def _take(self, buffer: _Buffer) -> ChunkRun:
        chunk = ChunkRun(buffer.handler, buffer.runs)
        buffer.runs = []
        self._buffered -= len(chunk.runs)
        for run in chunk.runs:
            self._chunk_of[run] = chunk
        self._left[chunk] = len(chunk.runs)
        self.pending = any(b.runs for b in self._buffers.values())
        return chunk
