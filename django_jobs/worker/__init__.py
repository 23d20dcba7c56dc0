"""The worker: claims due jobs, runs their handlers (threads, an event loop), settles them.

One dispatcher loop (the thread that calls ``Worker.run``) owns one database
connection and does every claim, settle and heartbeat; ``concurrency`` executor
threads run handlers (each with its own connection, opened only if the handler
touches the database); on PostgreSQL one listener thread waits for NOTIFY
wake-ups. A worker therefore holds at most concurrency + 2 connections.

Guarantees, in the order a job meets them:

- a claim leases jobs to a token and counts an attempt each, so a job that kills
  its worker every time still ends in the dead letters after max attempts;
- leases are extended while jobs are held (heartbeat) and every settle is fenced
  on the token: a worker whose lease was taken over changes nothing;
- a job whose completion marker exists is settled as done without running;
- successes are settled in batches (delete + marker in one statement); atomic
  handlers commit their marker with their own effects instead;
- failures retry with the handler's backoff, then dead-letter (django_jobs.lifecycle
  decides which).

Throughput comes from keeping the executors busy while the dispatcher waits on
the database: claimed jobs go straight onto the executors' queue (up to the
concurrency plus a short look-ahead sized from how long jobs take), and
successes are settled together every few milliseconds.

Modules: ``dispatcher`` (Worker: the loop, claiming, leases, shutdown),
``slots`` (how many jobs to claim), ``attempt`` (one attempt of a handler, for
both executors), ``executor`` (the threads, for sync handlers), ``eventloop``
(the event loop, for async handlers), ``settle`` (carrying out the lifecycle's
transitions), ``timeouts`` (handlers that outlive their timeout), ``guard`` (the
dispatcher's database access), ``options``, ``listener`` (NOTIFY), ``upkeep``
(heartbeat row, schedules, pruning, counters), ``runs`` (what they pass each other),
``inline`` (the worker driven one round at a time from the caller's thread: drain()).
"""

from django_jobs.worker.dispatcher import Worker
from django_jobs.worker.runs import EXIT_STUCK, DatabaseAway, HandlersStuck, WorkerStats

__all__ = ["EXIT_STUCK", "DatabaseAway", "HandlersStuck", "Worker", "WorkerStats"]
