"""The shipped failure records load with the counts their README states, wherever the
package is; a record of one's own loads from a CSV of node and time columns."""
import os

import numpy as np
import pytest

from sim.errors import SimError
from sim.nodes import DOMAINS, NodeFailures
from sim.records import (LANL_ATTRIBUTION, PHILLY_ATTRIBUTION, SHIPPED, InterruptionRecord,
                         NodeRecord, lanl_systems, read_lanl, read_node_csv, read_philly,
                         read_record, record_path)


def test_shipped_records_are_found_by_name_from_any_directory(tmp_path):
    here = os.getcwd()
    try:
        os.chdir(tmp_path)
        for name, file in SHIPPED.items():
            path = record_path(name)
            assert path.is_file() and path.name == file
            assert (path.parent / "README.md").read_text().count(file) == 1
    finally:
        os.chdir(here)
    assert record_path("somewhere/else.csv").name == "else.csv"


def test_lanl_counts_are_the_readmes():
    """README: 23,739 node failures; systems 18 and 19 of 1,024 nodes fail every 7.3 h and
    7.7 h as whole systems, system 20 (512 nodes) every 13.2 h."""
    systems = lanl_systems()
    assert int(systems["failures"].sum()) == 23_739
    for system, nodes, failures, hours in ((18, 1024, 3997, 7.3), (19, 1024, 3284, 7.7),
                                           (20, 512, 2478, 13.2)):
        record = read_lanl(system=system)
        assert (record.nodes, record.failures) == (nodes, failures)
        assert record.span_s / record.failures / 3600 == pytest.approx(hours, abs=0.05)
        assert record.attribution == LANL_ATTRIBUTION and "Los Alamos" in record.attribution
        assert (np.diff(record.times_s) >= 0).all() and record.node.max() < nodes
    assert np.unique(read_lanl(system=18).node).size == 964          # nodes that ever failed


def test_philly_counts_are_the_readmes():
    """README: 1,456 interruptions; restart gap median 186 s, 90th percentile 1,575 s."""
    record = read_philly()
    assert isinstance(record, InterruptionRecord) and record.failures == 1456
    assert np.percentile(record.restart_gap_s, 50, method="inverted_cdf") == 186
    assert np.percentile(record.restart_gap_s, 90, method="inverted_cdf") == 1575
    assert record.gpus.min() == 4 and record.attribution == PHILLY_ATTRIBUTION


def test_read_record_tells_the_kind_by_its_columns(tmp_path):
    assert read_record("lanl", system=20).name == "LANL system 20"
    assert isinstance(read_record("philly"), InterruptionRecord)
    own = tmp_path / "mine.csv"
    own.write_text("node,time\n0,1h\n3,2h\n0,5h\n")
    record = read_record(own)
    assert isinstance(record, NodeRecord) and record.nodes == 4
    np.testing.assert_allclose(record.times_s, [0.0, 3600.0, 4 * 3600.0])
    assert record.span_s == pytest.approx(4 * 3600.0 * 3 / 2)   # + one mean gap
    assert "mine.csv" in record.attribution
    assert read_node_csv(own, nodes=10).nodes == 10


@pytest.mark.parametrize("call,match", [
    (lambda p: read_record("lanl"), "--system"),
    (lambda p: read_record("lanl", system=99), "system 99"),
    (lambda p: read_record("lanl", system=17), "lacks node counts"),
    (lambda p: read_record("philly", system=18), "not LANL"),
    (lambda p: read_record(p / "none.csv"), "no such file"),
    (lambda p: read_record(_write(p, "time\n1h\n2h\n")), "'node' and 'time'"),
    (lambda p: read_record(_write(p, "node,time\n0,1h\n")), "at least two"),
    (lambda p: read_record(_write(p, "node,time\n0,1h\nx,2h\n")), "mine.csv"),
])
def test_bad_records(tmp_path, call, match):
    with pytest.raises(SimError, match=match):
        call(tmp_path)


def _write(folder, text):
    path = folder / "mine.csv"
    path.write_text(text)
    return path


@pytest.mark.parametrize("kwargs,match", [
    ({"times_s": [2.0, 1.0], "node": [0, 0]}, "ascending"),
    ({"times_s": [1.0, 2.0], "node": [0, 5]}, "0 .. 1"),
    ({"times_s": [1.0, 20.0], "node": [0, 1]}, "span_s"),
    ({"times_s": [1.0], "node": [0, 1]}, "one node per"),
    ({"times_s": [1.0, 2.0], "node": [0, 1], "attribution": " "}, "attribution"),
])
def test_bad_node_records(kwargs, match):
    fields = {"name": "r", "nodes": 2, "span_s": 10.0, "attribution": "me", **kwargs}
    with pytest.raises(SimError, match=match):
        NodeRecord(**fields)


def test_lanl_system_18_replayed_onto_its_1024_nodes():
    """Every seed plays the record from another start: 30 days draw about 30 d / 7.33 h = 98
    failures (the seeds' mean within 15%: the record's own months differ), some of them
    several nodes at one instant (the record's co-failures, 3.7% of its failures)."""
    model = NodeFailures(nodes=1024, node_law=read_lanl(system=18))
    assert model.job_mtbf_s() / 3600 == pytest.approx(7.335, abs=0.001)
    runs = [model.draw(np.random.default_rng(s), 30 * 86400.0) for s in range(20)]
    assert np.mean([r.nodes_lost.sum() for r in runs]) == pytest.approx(98.2, rel=0.15)
    simultaneous = sum(int((r.domain == DOMAINS.index("simultaneous")).sum()) for r in runs)
    assert simultaneous > 0
    assert len({float(r.times_s[0]) for r in runs}) == 20
