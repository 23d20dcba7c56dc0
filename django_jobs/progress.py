"""A running job's progress as stored (ctx.progress()), read back for the admin and status.

The worker writes what limits.progress() returns; a hand-edited row may hold
anything, so reading never trusts the column's shape.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple


class Progress(NamedTuple):
    done: float
    total: float | None
    note: str

    @property
    def fraction(self) -> float | None:
        """done / total, from 0 to 1; None when the total is unknown."""
        if self.total is None:
            return None
        return min(1.0, self.done / self.total)

    def __str__(self) -> str:
        done = _number(self.done)
        shown = done if self.total is None else f"{done}/{_number(self.total)}"
        if self.fraction is not None:
            shown += f" ({self.fraction:.0%})"
        return f"{shown} {self.note}".strip()


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _count(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:
            return None
        return number if math.isfinite(number) and number >= 0 else None
    return None


def read(value: Any) -> Progress | None:
    """The Progress stored in a progress column, or None (none, or not one the worker wrote)."""
    if not isinstance(value, dict):
        return None
    done = _count(value.get("done"))
    total = value.get("total")
    whole = None if total is None else _count(total)
    note = value.get("note", "")
    if done is None or (total is not None and not whole) or not isinstance(note, str):
        return None
    return Progress(done, whole, note[:200])
