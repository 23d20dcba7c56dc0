"""Moved to django_jobs.worker.upkeep; this module keeps the old import path working."""

from django_jobs.worker.upkeep import DURATION_BUCKETS, Upkeep, UpkeepHost

WorkerOps = Upkeep

__all__ = ["DURATION_BUCKETS", "Upkeep", "UpkeepHost", "WorkerOps"]
