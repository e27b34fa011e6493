"""``sim.progress``: a bar on stderr where asked or where stderr is a terminal, else nothing."""
import io
import sys

from sim.progress import Progress, shown


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_shown_follows_the_flag_else_whether_stderr_is_a_terminal(monkeypatch):
    assert shown(True) and not shown(False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not shown(None)
    monkeypatch.setattr(sys, "stderr", _Terminal())
    assert shown(None)


def test_a_bar_goes_to_stderr_and_a_disabled_one_writes_nothing(monkeypatch, capsys):
    with Progress("python -m sim paper", enabled=False) as bar:
        bar(1, 4)
        bar.stage("searching", 2, 4)
    assert capsys.readouterr() == ("", "")
    with Progress("python -m sim paper", enabled=True) as bar:
        bar(1, 4)
        bar.stage("searching", 2, 4)
        bar(4, 4)
    out, err = capsys.readouterr()
    assert out == "" and "python -m sim paper" in err and "4/4" in err
