"""The suite's tiers by measured cost: what each holds, the most one test may take, the order the
parallel workers take tests in, and the time each tier took (printed at the end of every run).

A test's tier is its first marker among ``dist``, ``e2e``, ``slow`` and ``serial``; unmarked, it is
``fast``. ``serial`` also joins another tier's marker (``e2e`` + ``serial``: that tier's limit, run
alone). The limit is on setup + call (a module fixture's cost lands on its first test), several
times the longest the tier's tests take on a quiet 2-core machine, so that a loaded machine stays
inside it while a test that grew into the next tier fails, naming the marker to give it. ``make test-fast``
runs the ``fast`` tier (the edit loop, under 2 minutes); ``make test`` (CI) runs every tier:
``fast``/``slow``/``e2e``/``dist`` on parallel workers, then ``serial`` alone. Budgets:
docs/contributing.md. ``GRPOKIT_TEST_LIMITS=off`` turns the limits off (profiling, a debugger).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict

import pytest

#: tier -> (the most one test may take, seconds of setup + call; what the tier holds)
TIERS: dict[str, tuple[float, str]] = {
    "dist": (240.0, "starts two or more ranks (torchrun, torch.multiprocessing)"),
    "e2e": (600.0, "runs the packaged 135M model, or grpokit as a user does (a CLI process end to end)"),
    "slow": (120.0, "anything else that takes 1 s or more on a quiet 2-core machine"),
    "serial": (120.0, "uses or measures the whole machine (every core): runs alone, after the parallel tiers"),
    "fast": (10.0, "the rest: under 1 s each on a quiet 2-core machine"),
}
#: the order tiers are handed to parallel workers: the longest first, so that no long test starts last
ORDER = ("e2e", "dist", "slow", "serial", "fast")
MARKERS = [f"{name}: {what} (fails over {limit:.0f} s)" for name, (limit, what) in TIERS.items() if name != "fast"]

_SETUP_S = pytest.StashKey[float]()


def tier_of(keywords) -> str:
    """The tier of a test from its markers (``item.keywords`` or a report's ``keywords``)."""
    return next((name for name in ("dist", "e2e", "slow", "serial") if name in keywords), "fast")


def _uses_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(d[-1].scope in ("module", "class", "package") for d in defs if d)


def order_and_group(items: list[pytest.Item], group: bool = True) -> None:
    """Sort ``items`` (stable) by :data:`ORDER`; with ``group`` (xdist loaded: otherwise the marker
    is unknown), tests that share a module- or class-scoped fixture go to one worker
    (``xdist_group``: set up once, not once per worker)."""
    rank = {name: i for i, name in enumerate(ORDER)}
    items.sort(key=lambda it: rank[tier_of(it.keywords)])
    for item in items if group else ():
        if _uses_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


def limits_on() -> bool:
    return os.environ.get("GRPOKIT_TEST_LIMITS", "on") != "off"


def check_limit(item: pytest.Item, report: pytest.TestReport) -> None:
    """Record the setup time; after the call, fail a passed test that took longer than its tier allows."""
    if report.when == "setup":
        item.stash[_SETUP_S] = report.duration
        return
    if report.when != "call" or not report.passed or not limits_on():
        return
    tier = tier_of(item.keywords)
    limit = TIERS[tier][0]
    took = item.stash.get(_SETUP_S, 0.0) + report.duration
    if took > limit:
        nxt = {"fast": "slow", "slow": "e2e"}.get(tier)
        hint = f"make it faster or mark it @pytest.mark.{nxt}" if nxt else "make it faster"
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} took {took:.1f} s (setup + call), over the {tier} tier's limit of {limit:.0f} s: "
            f"{hint} (tests/support/tiers.py)"
        )


class TierClock:
    """Sums each tier's test seconds (setup + call + teardown, as the workers report them) and prints
    them with the run's wall time."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = defaultdict(float)
        self.tests: dict[str, int] = defaultdict(int)

    def add(self, report: pytest.TestReport) -> None:
        tier = tier_of(report.keywords)
        self.seconds[tier] += report.duration
        if report.when == "call" or (report.when == "setup" and report.skipped):
            self.tests[tier] += 1

    def lines(self, workers: int, wall: float | None = None) -> list[str]:
        """The table; ``wall``: the session's seconds (default: since this clock started)."""
        wall = time.perf_counter() - self.start if wall is None else wall
        out = [f"{'tier':<7} {'tests':>6} {'test s':>8} {'limit/test':>11}"]
        for tier in ORDER:
            if self.tests.get(tier):
                out.append(f"{tier:<7} {self.tests[tier]:>6} {self.seconds[tier]:>8.1f} {TIERS[tier][0]:>10.0f}s")
        total = sum(self.seconds.values())
        out.append(f"{'all':<7} {sum(self.tests.values()):>6} {total:>8.1f}   wall {wall:.1f} s on {workers} worker(s)")
        return out
