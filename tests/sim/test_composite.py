"""sim.composite: the copies a composite recovery loads, from a job's start and after a restore."""
from __future__ import annotations

import numpy as np
import pytest

from layercheck.contract.trace import last_written
from sim.composite import Composite


def _job(seed: int, steps: int, layers: int = 3):
    rng = np.random.default_rng(seed)
    written = rng.random((steps, layers)) < 0.3
    last = np.vstack([np.zeros((1, layers), dtype=np.int64), last_written(written)])
    restarted = np.minimum(np.arange(steps + 1)[:, None] + rng.integers(1, 12, (steps + 1, layers)),
                           steps + 1)
    return last, restarted, rng.random(layers)


def _walked(last, restarted, c, j):
    """The definition, one layer and one step at a time."""
    out = []
    for layer in range(last.shape[1]):
        low = min(j, c)
        if low == 0:
            out.append(max(int(last[c, layer]), low))
            continue
        s = low
        while restarted[s, layer] <= c:
            s = int(restarted[s, layer])
        out.append(s)
    return out


@pytest.mark.parametrize("steps", [1, 2, 7, 64, 200])
def test_the_lifted_walk_is_the_walk_step_by_step(steps):
    last, restarted, weights = _job(steps, steps)
    composite = Composite.of(last, restarted, weights)
    assert 2 ** len(composite.lifts) > steps  # enough levels for any walk
    c = np.array([c for c in range(steps + 1) for _ in range(c + 1)])
    j = np.array([j for c in range(steps + 1) for j in range(c + 1)])
    got = composite.since(c, j)
    assert got.tolist() == [_walked(last, restarted, int(a), int(b)) for a, b in zip(c, j)]


def test_jobs_stacked_with_their_offsets_answer_as_each_alone():
    parts = [_job(1, 30), _job(2, 5), _job(3, 90)]
    weights = parts[0][2]  # the strategies of one workload: one model's layers
    alone = [Composite.of(last, restarted, weights) for last, restarted, _ in parts]
    stacked = Composite.stack(alone)
    offsets = np.cumsum([0] + [p[0].shape[0] for p in parts[:-1]])
    rng = np.random.default_rng(0)
    for part, off, (last, _, _) in zip(alone, offsets, parts):
        steps = last.shape[0] - 1
        c = rng.integers(0, steps + 1, 50)
        j = rng.integers(0, steps + 1, 50) % (c + 1)
        np.testing.assert_array_equal(stacked.since(c, j, off), part.since(c, j))
        work = np.cumsum(rng.random(stacked.last.shape[0]))
        np.testing.assert_allclose(stacked.stale_s(work, c, j, off),
                                   part.stale_s(work[off:off + steps + 1], c, j))


def test_a_consistent_point_and_an_unknown_restart_read_the_uninterrupted_run():
    last, restarted, weights = _job(4, 20)
    consistent = Composite.consistent(20, 3, weights)
    c = np.arange(21)
    assert (consistent.stale_s(np.arange(21.0), c, c // 2) == 0).all()
    unknown = Composite.of(last, None, weights)
    np.testing.assert_array_equal(unknown.since(c, c // 2), np.maximum(last[c], (c // 2)[:, None]))
    # mixed in a stack, each part keeps its own rule
    both = Composite.stack([Composite.of(last, restarted, weights), consistent])
    assert both.since(np.array([10]), np.array([4]), np.array([21])).tolist() == [[10, 10, 10]]
    assert both.since(np.array([10]), np.array([4])).tolist() == [_walked(last, restarted, 10, 4)]


def test_shapes_broadcast_as_the_first_order_form_asks():
    last, restarted, weights = _job(5, 40)
    composite = Composite.of(last, restarted, weights)
    c = np.array([10, 20, 30])
    j = np.array([[0, 5, 10], [0, 10, 20], [3, 29, 30]])
    got = composite.stale_s(np.arange(41.0), c[:, None], j)
    assert got.shape == (3, 3)
    assert got[1, 1] == pytest.approx(sum(w * (20 - s) for w, s in
                                          zip(weights, _walked(last, restarted, 20, 10))))


def test_the_embeddings_share_of_the_staleness_by_hand():
    from sim.composite import embedding_share
    params, embedding = np.array([3.0, 1.0]), np.array([True, False])
    # a base at step 1; the embedding rewritten at step 3, the block never again:
    # t=2: ages 1 and 1 -> 3 and 1; t=3: 0 and 2 -> 0 and 2: the embedding's 3 of 6
    written = np.array([[1, 1], [0, 0], [1, 0]], dtype=bool)
    assert embedding_share(written, params, embedding) == pytest.approx(0.5)
    # the base at step 2 (before it nothing counts); t=3: 3 and 0; t=4: 6 and 1
    written = np.array([[0, 1], [1, 1], [0, 1], [0, 0]], dtype=bool)
    assert embedding_share(written, params, embedding) == pytest.approx(9 / 10)
    assert embedding_share(np.ones((3, 2), dtype=bool), params, embedding) == 0.0  # never stale


def test_phi_is_carried_over_by_the_composition_and_says_so(monkeypatch):
    import sim.composite
    from layercheck.contract.figure import Figure
    parts = {"blocks": Figure(value=2.0, low=1.0, high=3.0, source="measured", method="b"),
             "embedding": Figure(value=0.4, low=0.2, high=0.8, source="measured", method="e")}
    monkeypatch.setattr(sim.composite, "STALE_COST_PARTS", parts)
    fig = sim.composite.transfer_stale_cost(0.25, "qwen2.5-7b-synthetic")
    assert (fig.value, fig.low, fig.high) == (pytest.approx(0.75 * 2.0 + 0.25 * 0.4),
                                              pytest.approx(0.75 * 1.0 + 0.25 * 0.2),
                                              pytest.approx(0.75 * 3.0 + 0.25 * 0.8))
    assert fig.source == "transferred"
    assert "qwen2.5-7b-synthetic" in fig.method and "25.0%" in fig.method
    assert sim.composite.transfer_stale_cost(1.0, "x").value == pytest.approx(0.4)
    transfer_stale_cost = sim.composite.transfer_stale_cost
    with pytest.raises(ValueError, match="fraction"):
        transfer_stale_cost(1.5, "x")
