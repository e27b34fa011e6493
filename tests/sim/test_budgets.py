"""sim.budgets: which settings meet the budgets; bad budgets are one line that names the flag."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim.budgets import Budgets
from sim.errors import SimError


def test_rows_within_every_budget_and_a_missing_figure_meets_it():
    table = pd.DataFrame({"bytes_written": [1e9, 5e9, 2e9], "write_share": [0.01, 0.02, 0.5],
                          "host_bytes": [0.0, 1e9, 3e11], "max_staleness": [np.nan, 50.0, 200.0]})
    budgets = Budgets(max_bytes=4e9, max_write_share=0.6, max_host_bytes=5e11, max_staleness=100)
    assert budgets.within(table).tolist() == [True, False, False]
    renamed = table.rename(columns={"bytes_written": "job_bytes"})
    assert budgets.within(renamed, columns={"bytes_written": "job_bytes"}).tolist() == \
        [True, False, False]
    assert Budgets().within(table).all() and not Budgets().any()


def test_flags_in_their_units_and_in_words():
    b = Budgets.from_flags(max_gb=500, max_host_gb=200, max_write_share=0.05)
    assert (b.max_bytes, b.max_host_bytes) == (500e9, 200e9)
    assert b.text() == "--max-gb 500, --max-write-share 0.05, --max-host-gb 200"
    assert b.to_dict()["max_host_gb"] == 200


@pytest.mark.parametrize("kwargs, words", [({"max_bytes": -1.0}, "--max-gb must be a positive"),
                                           ({"max_host_bytes": 0.0}, "--max-host-gb must be"),
                                           ({"max_write_share": 5.0}, "--max-write-share must be")])
def test_a_bad_budget_names_its_flag(kwargs, words):
    with pytest.raises(SimError, match=words):
        Budgets(**kwargs)
