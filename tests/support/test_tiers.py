"""tests/support/tiers.py: a test's tier from its markers, the limit that fails a test grown out of its
tier, the order parallel workers take tests in, and the time-per-tier lines."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from support import tiers


class FakeItem:
    def __init__(self, nodeid: str, *markers: str) -> None:
        self.nodeid, self.keywords, self.stash = nodeid, {m: 1 for m in markers}, pytest.Stash()
        self.added: list = []

    def add_marker(self, mark) -> None:
        self.added.append(mark)


def report(when: str, duration: float, outcome: str = "passed"):
    return SimpleNamespace(
        when=when, duration=duration, outcome=outcome, passed=outcome == "passed", skipped=False, longrepr=None
    )


def test_the_tier_is_the_first_tier_marker():
    assert tiers.tier_of({}) == "fast"
    assert tiers.tier_of({"slow": 1, "parametrize": 1}) == "slow"
    assert tiers.tier_of({"slow": 1, "dist": 1}) == "dist"
    assert tiers.tier_of({"e2e": 1, "slow": 1}) == "e2e"


@pytest.mark.parametrize(
    ("markers", "setup_s", "call_s", "fails"),
    [
        ((), 0.2, 9.7, False),  # 9.9 s: inside the fast tier's 10 s
        ((), 4.0, 6.5, True),  # 10.5 s with its setup: over
        (("slow",), 30.0, 80.0, False),
        (("slow",), 1.0, 121.0, True),
    ],
)
def test_a_test_over_its_tiers_limit_fails_naming_the_next_marker(markers, setup_s, call_s, fails):
    item = FakeItem("tests/x/test_y.py::test_z", *markers)
    tiers.check_limit(item, report("setup", setup_s))
    rep = report("call", call_s)
    tiers.check_limit(item, rep)
    assert (rep.outcome == "failed") == fails
    if fails:
        tier = markers[0] if markers else "fast"
        nxt = {"fast": "slow", "slow": "e2e"}[tier]
        limit = tiers.TIERS[tier][0]
        took = setup_s + call_s
        assert rep.longrepr.startswith(
            f"tests/x/test_y.py::test_z took {took:.1f} s (setup + call), over the {tier} tier's limit of {limit:.0f} s"
        )
        assert f"mark it @pytest.mark.{nxt}" in rep.longrepr


def test_a_failed_test_and_limits_off_are_left_alone(monkeypatch):
    item = FakeItem("t::f")
    rep = report("call", 99.0, outcome="failed")
    tiers.check_limit(item, rep)
    assert rep.longrepr is None  # its own failure stands
    monkeypatch.setenv("GRPOKIT_TEST_LIMITS", "off")
    rep = report("call", 99.0)
    tiers.check_limit(item, rep)
    assert rep.outcome == "passed"


def test_workers_take_the_longest_tiers_first_keeping_file_order_within_a_tier():
    items = [
        FakeItem("a::1"),
        FakeItem("a::2", "slow"),
        FakeItem("b::1", "dist"),
        FakeItem("b::2"),
        FakeItem("c::1", "e2e"),
    ]
    tiers.order_and_group(items)
    assert [i.nodeid for i in items] == ["c::1", "b::1", "a::2", "a::1", "b::2"]
    assert not any(i.added for i in items)  # no shared module fixture: no xdist group


def test_the_clock_sums_each_tiers_seconds_and_counts_its_tests():
    clock = tiers.TierClock()
    for when, d in (("setup", 0.5), ("call", 2.0), ("teardown", 0.1)):
        clock.add(SimpleNamespace(keywords={"slow": 1}, when=when, duration=d, skipped=False))
    clock.add(SimpleNamespace(keywords={}, when="call", duration=0.25, skipped=False))
    lines = clock.lines(workers=2)
    assert lines[1].split() == ["slow", "1", "2.6", "120s"]
    assert lines[2].split() == ["fast", "1", "0.2", "10s"]  # 0.25 printed to one decimal
    assert lines[3].split()[:3] == ["all", "2", "2.9"] and lines[3].endswith("on 2 worker(s)")
