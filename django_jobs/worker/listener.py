"""The listener: on PostgreSQL, one thread waits for NOTIFY and wakes the dispatcher."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connections

from django_jobs.worker.executor import close_quietly

logger = logging.getLogger("django_jobs.worker")

# How often the listener looks up from its socket to see whether the worker is stopping.
LISTEN_TIMEOUT = 0.25
# Reconnection backoff after database errors.
RETRY_MIN, RETRY_MAX = 0.1, 5.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Listener:
    """LISTEN on channel and call wake(queue) for each notification, until closing is set."""

    database: str
    channel: str
    wake: Callable[[str | None], None]
    closing: threading.Event
    worker_id: str

    def run(self) -> None:
        """Listen until closing is set, reconnecting with backoff; never raises."""
        pause = RETRY_MIN
        while not self.closing.is_set():
            conn = connections[self.database]
            try:
                conn.ensure_connection()
                raw = conn.connection
                with conn.cursor() as cursor:
                    cursor.execute(f"LISTEN {conn.ops.quote_name(self.channel)}")
                # Jobs enqueued while this connection was not listening got no
                # notification: claim once to catch them.
                self.wake(None)
                pause = RETRY_MIN
                while not self.closing.is_set():
                    for note in raw.notifies(timeout=LISTEN_TIMEOUT):
                        self.wake(note.payload)
            except Exception:  # noqa: BLE001 - any failure means: reconnect
                if self.closing.is_set():
                    break
                logger.warning(
                    "worker %s: listener lost its connection; reconnecting in %.1fs",
                    self.worker_id,
                    pause,
                    exc_info=True,
                )
                close_quietly(conn)
                self.closing.wait(pause)
                pause = min(RETRY_MAX, pause * 2)
        close_quietly(connections[self.database])
