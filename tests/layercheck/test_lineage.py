"""The lineage (``layercheck.storage.lineage``): which timeline owns which step, from the
manifest's resume records; kept by compaction and gc; old directories read as one timeline."""
from __future__ import annotations

import re

import pytest

from layercheck.storage.format import MANIFEST, Version, check_record, encode_record, resume_record
from layercheck.storage.lineage import TIMELINE, Branch, Lineage, new_timeline
from layercheck.storage.localstore import LocalStore
from layercheck.storage.manifest import compact, read_manifest

HEADER = {"kind": "header", "layers": [{"name": "a", "kind": "block", "params": 1}]}


def state(step: int) -> dict:
    return Version(step=step, file=f"states/{step:09d}.safetensors", bytes=1,
                   checksum="crc32:00000000").to_record()


def write(store: LocalStore, *records: dict) -> None:
    store.append(MANIFEST, b"".join(encode_record(r) for r in records))


def test_each_timeline_owns_its_steps_up_to_where_the_lineage_left_it():
    # A trains from 0; a restore of 6 opens B; B is rewound to 3 (C); C restored at 8 (D)
    lineage = Lineage().opened("a", 0).opened("b", 6).opened("c", 3).opened("d", 8)
    assert lineage.branches == (Branch("a", 0), Branch("c", 3), Branch("d", 8))
    assert lineage.current == "d"
    assert [lineage.owner(t).timeline for t in (1, 3, 4, 8, 9, 100)] == [
        "a", "a", "c", "c", "d", "d"]
    assert lineage.holds("a", 3) and not lineage.holds("a", 4)  # A was left at step 3
    assert lineage.holds("c", 8) and not lineage.holds("c", 9)
    assert lineage.holds("d", 9)
    assert not lineage.holds("b", 7) and not lineage.holds("b", 5)  # abandoned wholly
    assert not lineage.holds("d", 8)  # no timeline writes the step it was opened at


def test_a_restore_of_the_same_step_again_abandons_the_timeline_it_opened_before():
    lineage = Lineage().opened("a", 0).opened("b", 5).opened("c", 5)
    assert lineage.branches == (Branch("a", 0), Branch("c", 5))
    assert lineage.holds("a", 5) and lineage.holds("c", 6) and not lineage.holds("b", 6)


def test_a_refusal_says_abandoned_and_why():
    lineage = Lineage().opened("a", 0).opened("b", 6).opened("c", 3)
    assert lineage.refusal("c", 4) is None
    assert lineage.refusal("a", 5) == ("abandoned: a restore of step 3 left timeline a, "
                                       "which wrote it")
    assert lineage.refusal("b", 7) == ("abandoned: timeline b is not on the directory's "
                                       "lineage (a restore went back to before it began)")
    assert lineage.refusal("c", 2) == "abandoned: step 2 of the lineage is timeline a's, not c's"
    assert lineage.refusal(None, 2).startswith("abandoned: ")


def test_copies_and_records_without_ids_read_as_before():
    """A directory from before timeline ids: one anonymous timeline, every copy without
    an id usable; once a named timeline opens, an old copy is usable up to its start."""
    assert Lineage().holds(None, 7) and not Lineage().holds("a", 7)
    old = Lineage().opened(None, 0).opened(None, 4)
    assert old.holds(None, 9) and old.holds(None, 2)
    upgraded = old.opened("x", 6)
    assert upgraded.holds(None, 6) and not upgraded.holds(None, 7) and upgraded.holds("x", 7)


def test_the_manifest_replays_the_lineage_and_compaction_keeps_it(tmp_path):
    store = LocalStore(tmp_path)
    write(store, HEADER, resume_record(0, "a1"), state(1), state(2), state(3),
          resume_record(3, "b2"), state(4), resume_record(1, "c3"), state(2),
          {"kind": "resume", "step": 2})
    view = read_manifest(store)
    assert view.problems == []
    expected = Lineage((Branch("a1", 0), Branch("c3", 1), Branch(None, 2)))
    assert view.lineage == expected and sorted(view.states) == [1, 2]
    compact(store)
    again = read_manifest(store)
    assert again.lineage == expected and again.states == view.states
    assert again.problems == []


def test_a_timeline_id_is_checked_where_the_manifest_is_read():
    assert re.fullmatch(TIMELINE, new_timeline()) and new_timeline() != new_timeline()
    assert resume_record(4, "ab12") == {"kind": "resume", "step": 4, "timeline": "ab12"}
    assert resume_record(4) == {"kind": "resume", "step": 4}
    with pytest.raises(ValueError, match="timeline"):
        check_record({"kind": "resume", "step": 4, "timeline": "../x"})
