"""The result table (sim.results): lanes averaged per key, phi's accounting, the 95% band."""
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from layercheck.contract.calibration import Figure
from sim.engine import RESULT_FIELDS, LaneResults
from sim.results import COLUMNS, aggregate, stale_lost
from sim.strategies import Cadence

WINDOW = 100.0


def _lanes(**given) -> LaneResults:
    n = len(next(iter(given.values())))
    return LaneResults(**{f: np.asarray(given.get(f, np.zeros(n)), dtype=np.float64)
                          for f in RESULT_FIELDS})


def test_one_row_per_key_in_first_seen_order_with_its_mean_and_band():
    res = _lanes(useful_s=[50.0, 70.0, 90.0, 10.0], stale_s=[0.0, 0.0, 0.0, 4.0],
                 failures=[1.0, 3.0, 2.0, 5.0])
    every = Cadence(every=12, storage_every=48)
    keys = [(1, "b", every), (1, "b", every), (1, "b", every), (0, "a", None)]
    frame = aggregate(res, keys, [900.0, 1800.0], WINDOW, Figure(value=0.5, source="given", method="a test's"))
    assert list(frame.columns) == ["mtbf_s", *COLUMNS]
    assert list(frame.strategy) == ["b", "a"] and list(frame.mtbf_s) == [1800.0, 900.0]
    b, a = frame.iloc[0], frame.iloc[1]
    assert b.effective_ratio == pytest.approx(0.7) and b.failures == 2.0
    ratio = np.array([0.5, 0.7, 0.9])
    assert b.ci95 == pytest.approx(stats.t.ppf(0.975, 2) * ratio.std(ddof=1) / math.sqrt(3))
    assert (b.interval, b.storage_interval) == (12, 48)
    # one lane: no band; phi 0.5 of its 4 s stale counted as lost
    assert math.isnan(a.ci95) and frame["interval"].isna().tolist() == [False, True]
    assert a.stale_lost_s == 2.0 and a.useful_s == 8.0 and a.effective_ratio == 0.08


def test_phis_bounds_are_the_same_lanes_recomputed_and_never_train_backwards():
    res = _lanes(useful_s=[10.0], stale_s=[8.0])
    phi = Figure(value=0.5, low=0.25, high=2.0, source="measured", method="a test's")
    row = aggregate(res, [(0, "lc", None)], [60.0], WINDOW, phi).iloc[0]
    assert row.ratio_at_phi_low == (10.0 - 2.0) / WINDOW
    assert row.effective_ratio == (10.0 - 4.0) / WINDOW
    assert row.ratio_at_phi_high == 0.0          # 2 x 8 s is more than the 10 s it trained
    assert stale_lost(res, 2.0).tolist() == [10.0]


def _groupby_reference(res: LaneResults, keys: list, window: float, phi: Figure) -> pd.DataFrame:
    """The table as a pandas groupby averaged it: each column's mean over its key's lanes
    (NaN lanes left out), the ratio's mean and band by numpy, the t quantile by scipy.stats."""
    low, high = phi.interval
    lost = stale_lost(res, phi.value)
    useful = res.useful_s - lost
    lanes = pd.DataFrame({"key": keys, "ratio": useful / window, "useful_s": useful,
                          "ratio_at_phi_low": (res.useful_s - stale_lost(res, low)) / window,
                          "ratio_at_phi_high": (res.useful_s - stale_lost(res, high)) / window,
                          "stale_lost_s": lost,
                          **{f: getattr(res, f) for f in COLUMNS[6:-2] if f != "stale_lost_s"}})
    rows = []
    for (mi, name, cadence), group in lanes.groupby("key", sort=False):
        n, ratio = len(group), group["ratio"].to_numpy()
        half = float(stats.t.ppf(0.975, n - 1) * ratio.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
        rows.append({"mtbf_s": 60.0, "strategy": name, "effective_ratio": float(ratio.mean()),
                     "ci95": half, **{f: float(group[f].mean()) for f in COLUMNS[3:-2]},
                     "interval": None, "storage_interval": None})
    return pd.DataFrame(rows, columns=["mtbf_s", *COLUMNS])


def test_the_means_are_a_groupbys_to_the_bit_whatever_the_keys_order_and_nans():
    rng = np.random.default_rng(7)
    keys = [(0, f"s{i % 9}", None) for i in range(45)] + [(0, "seven", None)] * 7 + [(0, "one", None)]
    keys = [keys[i] for i in rng.permutation(len(keys))]
    cols = {f: rng.random(len(keys)) * 10.0 ** rng.integers(0, 12) for f in RESULT_FIELDS}
    cols["bytes_written"][[3, 7, 8]] = np.nan
    cols["recovery_s"][[i for i, k in enumerate(keys) if k[1] == "s4"]] = np.nan   # a whole key
    res = _lanes(**cols)
    phi = Figure(value=0.3, low=0.1, high=0.6, source="assumed", method="a test's")
    pd.testing.assert_frame_equal(aggregate(res, keys, [60.0], 1e6, phi),
                                  _groupby_reference(res, keys, 1e6, phi), check_exact=True)
