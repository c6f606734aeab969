"""Lanes: the named queues a job belongs to, and how a worker's claim loops
are split among them (issue #11, "Isolation"; contract: "Lanes").

A lane is stored on the job row (``jobs.lane``, set at enqueue) and a claim
loop only claims jobs of the lanes it serves, so a peer that is slow on
purpose or by accident (a hanging merchant endpoint, a trickling rail) holds
only its own lane's loops. The names are fixed (contract, HELPERS.md):

=============  ==================================================================
lane           kinds
=============  ==================================================================
``mtn``        ``poll``, ``resubmit``, ``refund_poll`` of charges/refunds on MTN
``orange``     the same on Orange Money
``webhooks``   ``fanout``, ``deliver``
``housekeeping`` ``scan``, ``sweep``; also the test kinds (``test.*``) and any
               kind no handler knows (its loop dead-letters it, visibly)
=============  ==================================================================

This module owns the mapping. The two SQL statements that insert jobs
without Python (``scan_live`` in sql/queries/money.sql: a poll's lane is its
charge's rail; ``fanout_deliveries`` in sql/queries/webhooks.sql:
``webhooks``) follow the same rule; tests/integration/test_lanes.py checks they agree.

The split (``split``): ``--worker-concurrency`` is the total number of claim
loops. Each lane served gets at least one loop of its own; the loops left
over are dealt one at a time to the lanes in priority order (``LANES``:
rails first), so 5 loops on all lanes give ``mtn`` 2. A rail lane whose rail
is not configured in this worker (its jobs can only wait) shares the
``housekeeping`` loop instead of taking one. With fewer loops than lanes,
neighbouring lanes in priority order share a loop (later groups larger):
3 loops → ``mtn`` | ``orange`` | ``webhooks+housekeeping``; 2 → ``mtn+orange``
| ``webhooks+housekeeping``; 1 → all. Lanes sharing a loop are not isolated
from each other; the worker logs a warning at boot saying which.
"""

from __future__ import annotations

from typing import Iterable, Mapping

LANES: tuple[str, ...] = ("mtn", "orange", "webhooks", "housekeeping")
"""Every lane, in priority order (the order spare loops are dealt in)."""

RAIL_LANES: tuple[str, ...] = ("mtn", "orange")
"""Lanes named after the rail whose API their jobs call."""

RAIL_KINDS = frozenset({"poll", "resubmit", "refund_poll"})
"""Kinds whose lane is the rail of their charge or refund."""

FIXED: Mapping[str, str] = {
    "fanout": "webhooks",
    "deliver": "webhooks",
    "scan": "housekeeping",
    "sweep": "housekeeping",
}
"""Kinds whose lane does not depend on a rail."""

DEFAULT_LANE = "housekeeping"
"""Test kinds (vpay/handlers/testing.py) and unknown kinds. Unknown kinds
are dead-lettered by ``handlers.handle`` on first claim; housekeeping is the
lane every default worker serves, so they are seen rather than stranded."""


class LaneError(ValueError):
    """A lane name, lane list or per-lane loop count that cannot be used.
    The message is one line, fit for ``refuse()`` (exit 78)."""


def lane_for(kind: str, rail: str | None = None) -> str:
    """The lane of a job of ``kind``. ``rail`` (``mtn``/``orange``: the
    rail of the job's charge or refund) is required for ``RAIL_KINDS`` and
    ignored otherwise. Raises ``LaneError`` for a rail kind without a known
    rail: such a job would sit in no lane any worker serves."""
    if kind in RAIL_KINDS:
        if rail not in RAIL_LANES:
            raise LaneError(f"job kind {kind!r} needs the rail of its charge or refund "
                            f"(one of {', '.join(RAIL_LANES)}), got {rail!r}")
        return rail
    return FIXED.get(kind, DEFAULT_LANE)


def parse_queues(text: str | None, source: str = "--queues") -> tuple[str, ...]:
    """``--queues mtn,webhooks`` → ``("mtn", "webhooks")`` in priority order,
    duplicates removed. ``None`` (not given) → every lane. ``source`` names
    where ``text`` came from in the error (the flag, or the environment
    variable). Raises ``LaneError`` on an empty value (``""`` would
    otherwise silently mean every lane), an empty name or an unknown lane."""
    if text is None:
        return LANES
    if not text.strip():
        raise LaneError(f"{source} is empty; give lanes like mtn,webhooks ({','.join(LANES)}), "
                        f"or leave it unset for every lane")
    names = [n.strip() for n in text.split(",")]
    if any(not n for n in names):
        raise LaneError(f"{source} {text!r}: empty lane name; give names like mtn,webhooks")
    unknown = [n for n in names if n not in LANES]
    if unknown:
        raise LaneError(f"{source}: unknown lane {unknown[0]!r}; lanes are {','.join(LANES)}")
    return tuple(lane for lane in LANES if lane in names)


def parse_lane_concurrency(text: str | None, source: str = "--lane-concurrency") -> dict[str, int]:
    """``--lane-concurrency mtn=2,webhooks=1`` → ``{"mtn": 2, "webhooks": 1}``.
    Each count is a whole number ≥ 1 (to leave a lane out, use ``--queues``).
    ``source`` names where ``text`` came from in the error. Raises
    ``LaneError`` on an unknown lane, a repeated lane, or a count that is not
    a positive integer."""
    if text is None or not text.strip():
        return {}
    counts: dict[str, int] = {}
    for item in text.split(","):
        name, sep, value = (p.strip() for p in item.partition("="))
        if not sep or not name:
            raise LaneError(f"{source} {text!r}: expected LANE=N,... (e.g. mtn=2,webhooks=1)")
        if name not in LANES:
            raise LaneError(f"{source}: unknown lane {name!r}; lanes are {','.join(LANES)}")
        if name in counts:
            raise LaneError(f"{source}: lane {name!r} given twice")
        if not value.isdigit() or int(value) < 1:
            raise LaneError(f"{source}: {name}={value!r} is not a whole number >= 1")
        counts[name] = int(value)
    return counts


def _share(lanes: list[str], loops: int) -> list[tuple[str, ...]]:
    # Contiguous groups in priority order, later groups larger: the rails stay
    # together and away from webhooks for as long as there are 2 loops.
    groups, start = [], 0
    for i in range(loops):
        size = len(lanes) // loops + (1 if i >= loops - len(lanes) % loops else 0)
        groups.append(tuple(lanes[start:start + size]))
        start += size
    return groups


def split(total: int, served: Iterable[str], overrides: Mapping[str, int] | None = None,
          passive: Iterable[str] = ()) -> list[tuple[str, ...]]:
    """The lanes each of ``total`` claim loops serves: a list of ``total``
    tuples (one per loop, each non-empty, in priority order).

    ``served``: the lanes of this worker (``--queues``). ``overrides``: exact
    loop counts for some lanes (``--lane-concurrency``); the other served
    lanes share the remaining loops by the default rule (module docstring).
    ``passive``: rail lanes whose rail is not configured here; they join the
    ``housekeeping`` loop instead of taking one of their own (only when
    housekeeping is served and not named in ``overrides``).

    Raises ``LaneError`` when ``overrides`` names a lane not served, when
    its counts sum above ``total``, when they leave no loop for the other
    served lanes, or when every served lane is named but the counts do not
    add up to ``total``."""
    served = [lane for lane in LANES if lane in set(served)]
    if not served:
        raise LaneError("no lane to serve")
    if total < 1:
        raise LaneError(f"--worker-concurrency {total}: at least 1 claim loop is needed")
    overrides = dict(overrides or {})
    extra = [lane for lane in overrides if lane not in served]
    if extra:
        raise LaneError(f"--lane-concurrency names {extra[0]!r}, which is not among --queues "
                        f"{','.join(served)}")
    named = sum(overrides.values())
    if named > total:
        raise LaneError(f"--lane-concurrency adds up to {named} loops, above --worker-concurrency {total}")
    rest = [lane for lane in served if lane not in overrides]
    left = total - named
    if rest and left == 0:
        raise LaneError(f"--lane-concurrency uses all {total} loops and leaves none for "
                        f"{','.join(rest)}; lower a count or narrow --queues")
    if not rest and left:
        raise LaneError(f"--lane-concurrency adds up to {named} loops, below --worker-concurrency "
                        f"{total}; give the rest to a lane")
    loops: list[tuple[str, ...]] = []
    for lane in served:
        loops += [(lane,)] * overrides.get(lane, 0)
    if rest:
        riders = [lane for lane in rest if lane in set(passive) and lane in RAIL_LANES]
        host = "housekeeping" if "housekeeping" in rest else None
        active = [lane for lane in rest if not (host and lane in riders)]
        if host is None or len(active) == len(rest):
            riders = []
        if left < len(active):
            groups = _share(active, left)
        else:
            per = {lane: 1 for lane in active}
            for i in range(left - len(active)):
                per[active[i % len(active)]] += 1
            groups = [(lane,) for lane in active for _ in range(per[lane])]
        if riders:
            groups = [tuple(lane for lane in LANES if lane in g or (host in g and lane in riders))
                      for g in groups]
        loops += groups
    return sorted(loops, key=lambda g: LANES.index(g[0]))


def describe(loops: list[tuple[str, ...]]) -> dict[str, int]:
    """``{"mtn": 2, "webhooks+housekeeping": 1, ...}``: loops per lane group,
    for the boot log line and the gauge."""
    out: dict[str, int] = {}
    for group in loops:
        key = "+".join(group)
        out[key] = out.get(key, 0) + 1
    return out
