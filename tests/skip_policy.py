"""No silent skips: a test run fails when a test was skipped, xfailed or xpassed,
unless ``tests/allowed_skips.txt`` allows it, with a reason.

A test that cannot run here (a missing package, browser or privilege) would
otherwise turn into an 's' in a line of dots, and CI would report success for
a suite that never ran it. Each line of the allow-list is

    <test id pattern> | <why a skip of it is acceptable, and what covers it instead>

where the pattern is an ``fnmatch`` pattern over pytest node ids (for a module
skipped as a whole, the id is the file's path). Blank lines and '#' comments
are ignored; a line without a reason is an error. ``LAYERCHECK_ALLOW_SKIPS=1``
turns the failure into a warning, for a partial local setup; CI never sets it.

Registered by the root ``tests/conftest.py`` for every run under ``tests/``.
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["SkipPolicy", "read_allow_list", "ALLOW_LIST"]

ALLOW_LIST = Path(__file__).with_name("allowed_skips.txt")
RELAX = "LAYERCHECK_ALLOW_SKIPS"


@dataclass(frozen=True)
class Allowed:
    pattern: str
    reason: str


@dataclass(frozen=True)
class Skip:
    nodeid: str
    outcome: str
    """'skipped', 'xfailed' or 'xpassed'."""
    reason: str


def read_allow_list(path: Path) -> list[Allowed]:
    """The entries of ``path`` (see the module doc); ValueError naming a bad line."""
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        pattern, sep, reason = (part.strip() for part in line.partition("|"))
        if not sep or not pattern or not reason:
            raise ValueError(f"{path}:{number}: write '<test id pattern> | <reason>'; every "
                             "allowed skip needs its reason")
        entries.append(Allowed(pattern, reason))
    return entries


class SkipPolicy:
    """The pytest plugin: collects every skip and xfail, fails the session on those
    the allow-list does not name, and says which and why in the terminal summary."""

    def __init__(self, allowed: list[Allowed], source: str = "the allow-list") -> None:
        self.allowed, self.source = allowed, source
        self.skips: dict[str, Skip] = {}

    @classmethod
    def from_file(cls, path: Path = ALLOW_LIST) -> "SkipPolicy":
        return cls(read_allow_list(path), _shown(path))

    def allowance(self, nodeid: str) -> Allowed | None:
        return next((a for a in self.allowed if fnmatch.fnmatchcase(nodeid, a.pattern)), None)

    @property
    def unlisted(self) -> list[Skip]:
        return [s for s in self.skips.values() if self.allowance(s.nodeid) is None]

    # -- hooks -----------------------------------------------------------------
    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:  # a module skipped as a whole (importorskip at its top)
            self._note(Skip(report.nodeid, "skipped", _reason(report)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed" if report.passed else None
            if outcome:
                self._note(Skip(report.nodeid, outcome, report.wasxfail or "xfail"))
        elif report.skipped:
            self._note(Skip(report.nodeid, "skipped", _reason(report)))

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.unlisted and not os.environ.get(RELAX) and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        allowed = [s for s in self.skips.values() if self.allowance(s.nodeid) is not None]
        write = terminalreporter.write_line
        if allowed:
            terminalreporter.section("allowed skips", sep="-")
            for skip in allowed:
                write(f"{skip.outcome} {skip.nodeid}: {skip.reason} "
                      f"(allowed: {self.allowance(skip.nodeid).reason})")
        unlisted = self.unlisted
        if not unlisted:
            return
        relaxed = bool(os.environ.get(RELAX))
        terminalreporter.section("skips that fail this run" if not relaxed else
                                 f"skips ({RELAX} is set: not failing)", sep="=", red=True)
        for skip in unlisted:
            write(f"{skip.outcome} {skip.nodeid}: {skip.reason}", red=not relaxed)
        write(f"{len(unlisted)} test(s) did not run and {self.source} does not allow it: install what they need (BROWSER=1 bash tools/setup.sh sets "
              "up everything), or add '<test id> | <reason>' to the allow-list"
              + ("" if relaxed else f", or set {RELAX}=1 for a partial local run"),
              red=not relaxed)

    def _note(self, skip: Skip) -> None:
        self.skips.setdefault(skip.nodeid, skip)


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)
