"""The no-silent-skips policy (tests/skip_policy.py), on a throwaway suite run in a
subprocess: skips, xfails and xpasses fail the run unless the allow-list names them."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.skip_policy import ALLOW_LIST, SkipPolicy, read_allow_list

ROOT = Path(__file__).resolve().parents[1]
SUITE = '''
import pytest
pytest.importorskip("no_such_module_anywhere") if __name__.endswith("gone") else None

def test_runs():
    pass

def test_skips():
    pytest.skip("no chromium here")

@pytest.mark.xfail(reason="known bug")
def test_xfails():
    assert False

@pytest.mark.xfail(reason="fixed, marker left behind")
def test_xpasses():
    pass
'''


def _run(tmp_path: Path, allowed: str, relax: bool = False) -> subprocess.CompletedProcess:
    (tmp_path / "allowed.txt").write_text(allowed)
    (tmp_path / "conftest.py").write_text(
        "from pathlib import Path\n"
        "from tests.skip_policy import SkipPolicy\n"
        "def pytest_configure(config):\n"
        "    config.pluginmanager.register(SkipPolicy.from_file(Path(__file__).with_name("
        "'allowed.txt')), 'skip-policy')\n")
    (tmp_path / "test_suite.py").write_text(SUITE)
    (tmp_path / "test_gone.py").write_text(SUITE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("LAYERCHECK_ALLOW_SKIPS", None)
    if relax:
        env["LAYERCHECK_ALLOW_SKIPS"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), str(tmp_path)], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=120)


def test_an_unlisted_skip_xfail_or_xpass_fails_the_run_and_is_named(tmp_path):
    done = _run(tmp_path, "")
    assert done.returncode == 1, done.stdout
    out = done.stdout
    assert "skips that fail this run" in out
    assert "4 test(s) did not run and allowed.txt does not allow it" in out
    assert "skipped test_suite.py::test_skips: no chromium here" in out
    assert "xfailed test_suite.py::test_xfails: known bug" in out
    assert "xpassed test_suite.py::test_xpasses: fixed, marker left behind" in out
    assert "skipped test_gone.py: could not import 'no_such_module_anywhere'" in out


def test_listed_skips_pass_and_are_reported_with_their_reason(tmp_path):
    done = _run(tmp_path, "# comment\n\ntest_suite.py::test_[sx]* | the reason\n"
                          "test_gone.py | another reason\n")
    assert done.returncode == 0, done.stdout
    assert "allowed skips" in done.stdout and "(allowed: the reason)" in done.stdout


def test_the_escape_hatch_reports_without_failing(tmp_path):
    done = _run(tmp_path, "", relax=True)
    assert done.returncode == 0, done.stdout
    assert "LAYERCHECK_ALLOW_SKIPS is set: not failing" in done.stdout


def test_an_allow_list_entry_needs_a_reason(tmp_path):
    (tmp_path / "bad.txt").write_text("tests/x.py::test_y\n")
    with pytest.raises(ValueError, match="bad.txt:1: .* needs its reason"):
        read_allow_list(tmp_path / "bad.txt")


def test_the_repositorys_allow_list_is_short_and_reasoned():
    entries = read_allow_list(ALLOW_LIST)
    assert len(entries) <= 5
    assert all(len(e.reason) > 40 for e in entries)
    assert isinstance(SkipPolicy.from_file(), SkipPolicy)
