"""vpay.engine.lanes without a database: the kind → lane mapping, the flag parsers
and the default split of --worker-concurrency among lanes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import vpay.money  # noqa: F401  (the domain registers its lanes: vpay.money.lanes)
from vpay.engine import lanes
from vpay.engine.lanes import LaneError, lane_for, parse_lane_concurrency, parse_queues, split


def test_every_kind_has_its_lane():
    for kind in ("poll", "resubmit", "refund_poll"):
        assert lane_for(kind, "mtn") == "mtn"
        assert lane_for(kind, "orange") == "orange"
    assert lane_for("fanout") == lane_for("deliver") == "webhooks"
    assert lane_for("scan") == lane_for("sweep") == "housekeeping"
    for kind in ("test.count", "test.exit", "test.raise", "test.retry", "no.such.kind"):
        assert lane_for(kind) == "housekeeping"


def test_a_rail_kind_without_a_known_rail_has_no_lane():
    for rail in (None, "airtel", ""):
        with pytest.raises(LaneError, match="poll"):
            lane_for("poll", rail)


def test_every_registered_handler_kind_maps_to_a_lane_every_default_worker_serves():
    from vpay import handlers
    for kind in handlers.REGISTRY:
        lane = lane_for(kind, "mtn")
        assert lane in lanes.LANES


def test_the_check_constraint_names_exactly_the_lanes():
    # The newest migration that rewrites jobs_lane_known is the one in force.
    files = sorted((Path(__file__).resolve().parents[2] / "sql").glob("0*.sql"))
    sql = [f.read_text() for f in files if "jobs_lane_known" in f.read_text()][-1]
    names = re.search(r"CHECK \(lane IN \(([^)]*)\)\)", sql).group(1)
    assert tuple(n.strip(" '") for n in names.split(",")) == lanes.LANES


def test_every_sql_insert_into_jobs_sets_the_lane():
    folder = Path(__file__).resolve().parents[2] / "sql" / "queries"
    inserts = []
    for path in folder.glob("*.sql"):
        inserts += re.findall(r"INSERT INTO jobs\s*\(([^)]*)\)", path.read_text())
    assert len(inserts) >= 3
    for columns in inserts:
        assert "lane" in [c.strip() for c in columns.split(",")], columns


def test_parse_queues():
    assert parse_queues(None) == lanes.LANES
    assert parse_queues("webhooks,mtn") == ("mtn", "webhooks")  # priority order
    assert parse_queues(" mtn , mtn ") == ("mtn",)
    for bad, says in (("nope", "'nope'"), ("mtn,", "empty"), ("MTN", "'MTN'"), ("mtn orange", "'mtn orange'"),
                      ("", "--queues is empty"), (" ", "--queues is empty")):
        with pytest.raises(LaneError, match=says):
            parse_queues(bad)


def test_parse_lane_concurrency():
    assert parse_lane_concurrency(None) == {}
    assert parse_lane_concurrency("mtn=2, webhooks=1") == {"mtn": 2, "webhooks": 1}
    for bad, says in (("mtn", "LANE=N"), ("=2", "LANE=N"), ("airtel=1", "unknown lane 'airtel'"),
                      ("mtn=x", "whole number"), ("mtn=1.5", "whole number"), ("mtn=0", "whole number"),
                      ("mtn=-1", "whole number"), ("mtn=1,mtn=2", "twice")):
        with pytest.raises(LaneError, match=says):
            parse_lane_concurrency(bad)


ALL = ("mtn", "orange", "webhooks", "housekeeping")
"""The split's cases, written on four lanes (the algorithm does not depend
on which rails exist); the registered six are below."""


def test_the_registered_lanes_split_with_unconfigured_rails_riding_on_housekeeping():
    assert lanes.LANES == ("mtn", "orange", "mpesa", "pawapay", "webhooks", "housekeeping")
    assert split(4, lanes.LANES, passive=("orange", "mpesa", "pawapay")) == [
        ("mtn",), ("mtn",), ("orange", "mpesa", "pawapay", "housekeeping"), ("webhooks",)]
    assert split(6, lanes.LANES) == [("mtn",), ("orange",), ("mpesa",), ("pawapay",), ("webhooks",),
                                     ("housekeeping",)]


@pytest.mark.parametrize("total, expected", [
    (5, [("mtn",), ("mtn",), ("orange",), ("webhooks",), ("housekeeping",)]),
    (4, [("mtn",), ("orange",), ("webhooks",), ("housekeeping",)]),
    (3, [("mtn",), ("orange",), ("webhooks", "housekeeping")]),
    (2, [("mtn", "orange"), ("webhooks", "housekeeping")]),
    (1, [ALL]),
])
def test_default_split_over_every_lane(total, expected):
    assert split(total, ALL) == expected


def test_an_unconfigured_rail_rides_on_the_housekeeping_loop():
    assert split(4, ALL, passive=("orange",)) == [
        ("mtn",), ("mtn",), ("orange", "housekeeping"), ("webhooks",)]
    assert split(5, ALL, passive=("orange",)) == [
        ("mtn",), ("mtn",), ("orange", "housekeeping"), ("webhooks",), ("webhooks",)]
    # nothing to ride on: the lane keeps its own loops
    assert split(2, ("orange",), passive=("orange",)) == [("orange",), ("orange",)]
    assert split(2, ("orange", "webhooks"), passive=("orange",)) == [("orange",), ("webhooks",)]


def test_split_of_some_lanes():
    assert split(4, ("mtn",)) == [("mtn",)] * 4
    assert split(4, ("mtn", "webhooks")) == [("mtn",), ("mtn",), ("webhooks",), ("webhooks",)]
    assert split(5, ("webhooks", "orange")) == [("orange",)] * 3 + [("webhooks",)] * 2


def test_overrides_are_exact_and_the_rest_share_what_is_left():
    assert split(5, ALL, {"mtn": 2, "webhooks": 1}) == [
        ("mtn",), ("mtn",), ("orange",), ("webhooks",), ("housekeeping",)]
    assert split(4, ALL, {"mtn": 2}) == [("mtn",), ("mtn",), ("orange",), ("webhooks", "housekeeping")]
    assert split(3, ("mtn", "webhooks"), {"mtn": 2, "webhooks": 1}) == [("mtn",), ("mtn",), ("webhooks",)]


@pytest.mark.parametrize("total, served, overrides, says", [
    (4, ALL, {"mtn": 3, "webhooks": 2}, "adds up to 5 loops, above --worker-concurrency 4"),
    (4, ALL, {"mtn": 2, "orange": 1, "webhooks": 1}, "leaves none for housekeeping"),
    (4, ("mtn", "webhooks"), {"mtn": 1, "webhooks": 1}, "below --worker-concurrency 4"),
    (4, ("mtn",), {"webhooks": 1}, "'webhooks', which is not among --queues mtn"),
])
def test_overrides_that_do_not_fit_are_refused(total, served, overrides, says):
    with pytest.raises(LaneError, match=re.escape(says)):
        split(total, served, overrides)


def test_every_split_has_exactly_total_loops_and_serves_every_lane():
    import itertools
    for total in range(1, 6):
        for n in range(1, len(ALL) + 1):
            for served in itertools.combinations(ALL, n):
                for passive in ((), ("orange",), ("mtn", "orange")):
                    loops = split(total, served, passive=passive)
                    assert len(loops) == total
                    assert all(loops)
                    assert {lane for g in loops for lane in g} == set(served)
                    if total >= len(served):  # enough loops: every active lane has one of its own
                        own = {g[0] for g in loops if len(g) == 1}
                        active = {lane for lane in served if lane not in passive} or set(served)
                        if "housekeeping" not in served:
                            active = set(served)
                        assert active <= own | {"housekeeping"}, (total, served, passive, loops)


def test_the_engine_alone_knows_only_its_own_lane_and_the_domain_registers_the_rest():
    # A fresh interpreter: the engine imported without the money layer holds
    # no domain name (issue 22: "lanes are registered by the layers above").
    import subprocess
    import sys
    code = ("from vpay.engine import lanes; print(','.join(lanes.LANES)); "
            "import vpay.money; print(','.join(lanes.LANES)); print(','.join(lanes.RAIL_LANES))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["housekeeping", "mtn,orange,mpesa,pawapay,webhooks,housekeeping",
                           "mtn,orange,mpesa,pawapay"]


def test_a_lane_registered_twice_with_other_settings_is_refused():
    lanes.register_lane("mtn", lanes._priority["mtn"], routed=True, fair=True)  # same: no change
    with pytest.raises(LaneError, match="twice"):
        lanes.register_lane("mtn", 1, routed=True, fair=True)
    with pytest.raises(LaneError, match="unknown lane"):
        lanes.register_kind("test.nowhere", "nowhere")
