from __future__ import annotations

import pickle

import pytest

from dashboard import answercache


class Search:
    """A stand-in for the search that counts how often it ran."""

    def __init__(self, value):
        self.value, self.calls = value, 0

    def __call__(self):
        self.calls += 1
        return self.value


def test_an_answer_is_computed_once_then_read_from_disk(answer_cache):
    search = Search({"winner": "layercheck", "ratio": 0.93})
    first = answercache.cached(["--mtbf", "0.5h"], search, False, 0.0)
    again = answercache.cached(["--mtbf", "0.5h"], search, False, 0.0)
    assert first == again == search.value and search.calls == 1
    assert [p.suffix for p in answer_cache.iterdir()] == [".pickle"]


def test_other_inputs_or_other_code_are_not_answered_from_the_store(answer_cache, monkeypatch):
    search = Search("answer")
    answercache.cached(["--mtbf", "0.5h"], search, False, 0.0)
    answercache.cached(["--mtbf", "1h"], search, False, 0.0)          # another job
    answercache.cached(["--mtbf", "0.5h"], search, True, 0.0)         # with the bands
    answercache.cached(["--mtbf", "0.5h"], search, False, 1.0)        # the trace changed
    assert search.calls == 4
    monkeypatch.setattr(answercache, "fingerprint", lambda: "the simulator changed")
    answercache.cached(["--mtbf", "0.5h"], search, False, 0.0)
    assert search.calls == 5


def test_the_fingerprint_follows_the_simulators_source(tmp_path, monkeypatch):
    answercache.fingerprint.cache_clear()
    before = answercache.fingerprint()
    sim = tmp_path / "sim"
    sim.mkdir()
    (sim / "engine.py").write_text("X = 1\n")
    monkeypatch.setattr(answercache, "_SOURCES", (sim,))
    answercache.fingerprint.cache_clear()
    one = answercache.fingerprint()
    (sim / "engine.py").write_text("X = 2\n")
    answercache.fingerprint.cache_clear()
    two = answercache.fingerprint()
    answercache.fingerprint.cache_clear()
    assert len({before, one, two}) == 3


def test_a_damaged_file_is_computed_again_and_replaced(answer_cache):
    search = Search([1, 2, 3])
    answercache.cached(["--mtbf", "0.5h"], search)
    (stored,) = answer_cache.iterdir()
    stored.write_bytes(pickle.dumps([1, 2, 3])[:5])                    # cut short
    assert answercache.cached(["--mtbf", "0.5h"], search) == [1, 2, 3] and search.calls == 2
    assert pickle.loads(stored.read_bytes()) == [1, 2, 3]


def test_a_folder_that_cannot_be_written_keeps_nothing_but_answers(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv(answercache.ENV, str(blocked / "answers"))
    search = Search("answer")
    assert answercache.cached(["--mtbf", "0.5h"], search) == "answer"
    assert answercache.cached(["--mtbf", "0.5h"], search) == "answer" and search.calls == 2


def test_only_the_most_recently_used_are_kept(answer_cache, monkeypatch):
    monkeypatch.setattr(answercache, "MAX_FILES", 3)
    for hours in range(5):
        answercache.cached(["--mtbf", f"{hours + 1}h"], Search(hours))
    assert len(list(answer_cache.glob("*.pickle"))) == 3
    search = Search("again")
    assert answercache.cached(["--mtbf", "1h"], search) == "again"     # the oldest went


def test_the_default_folder_is_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(answercache.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert answercache.folder() == tmp_path / "layercheck" / "answers"


@pytest.mark.parametrize("argv", [["--mtbf", "0.5h"]])
def test_the_page_and_the_command_line_name_the_same_winner_from_the_store(argv, answer_cache):
    """The answer read back is the search's own: the same verdict as a fresh search."""
    from dashboard import myjob
    fresh = myjob.answer(argv)
    answercache.cached(argv, lambda: fresh)
    stored = answercache.cached(argv, lambda: pytest.fail("searched again"))
    assert stored.verdict.text() == fresh.verdict.text()
    assert stored.verdict.winner == fresh.verdict.winner
