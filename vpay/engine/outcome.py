"""What a handler answers. The loop owns the job row; a handler only says
what should happen to it (design page: "The job queue").

* ``Done``: the work is over; the loop deletes the row (``finish``).
* ``RetryAfter(seconds)``: run again later; the loop sets ``run_at``.
* ``DeadLetter(reason)``: give up; the loop parks the row (``run_at =
  'infinity'``) with ``reason`` in ``last_error`` and raises an alert.

A handler may also raise ``JobError(decision)`` from deep inside a call stack;
any other exception is a failure the loop retries with backoff.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Done:
    note: str | None = None


@dataclass(frozen=True)
class RetryAfter:
    """``seconds`` from the database's ``now()``; ``note`` lands in ``last_error``
    (e.g. "rail no answer: 503") so an operator sees why a poll repeats.
    ``attempt_spent=False`` gives back the attempt the claim counted: the
    job was deferred without doing its work (a paused rail, a backed-off
    webhook endpoint), so it must not climb a rung of its ladder."""

    seconds: float
    note: str | None = None
    attempt_spent: bool = True

    def __post_init__(self) -> None:
        if not self.seconds >= 0:
            raise ValueError(f"RetryAfter needs seconds >= 0, got {self.seconds!r}")


@dataclass(frozen=True)
class DeadLetter:
    reason: str


Outcome = Done | RetryAfter | DeadLetter


class JobError(Exception):
    """Raised by a handler to carry its decision out of a deep call."""

    def __init__(self, decision: Outcome):
        super().__init__(str(decision))
        self.decision = decision
