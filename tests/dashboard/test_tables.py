"""Tables as people read them: words, units, separators, no floating-point dust."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from dashboard import tables


def test_the_failures_row_reads_in_hours_terabytes_and_words():
    frame = pd.DataFrame({"strategy": ["layercheck", "none"], "effective_ratio": [0.86901, 0.0109],
                          "useful_s": [475914.8592, 28440.0], "checkpoint_stall_s": [2e-16, 0.0],
                          "bytes_written": [18745865921539.2, 0.0], "interval": [np.nan, 95.0]})
    shown = tables.readable(frame).strings()
    assert list(shown.columns) == ["strategy", "effective ratio", "useful training (h)",
                                   "checkpoint stall (h)", "written (TB)", "interval (steps)"]
    row = shown.iloc[0]
    assert row["useful training (h)"] == "132.2"
    assert row["checkpoint stall (h)"] == "0.0"
    assert row["written (TB)"] == "18.7"
    assert row["effective ratio"] == "0.8690"
    assert row["interval (steps)"] == "–"


def test_counts_get_thousands_separators_and_large_times_hours():
    shown = tables.readable(pd.DataFrame({"params": [11918592, 5], "job_mtbf_s": [22800960.0, 3600.0],
                                          "bytes": [143025556, 1000]})).strings()
    assert shown["parameters"].tolist() == ["11,918,592", "5"]
    assert shown["job MTBF (h)"].iloc[0] == "6,334"
    assert shown["size (MB)"].iloc[0] == "143.0"


def test_dollars_gpu_hours_and_small_numbers():
    shown = tables.readable(pd.DataFrame({"usd_total": [15636.2, 2392.0], "gpu_h_stall": [578.3, 0.0],
                                          "mean_drift": [4.13e-6, 2.8e-6]})).strings()
    assert shown["total ($)"].tolist() == ["15,636", "2,392"]
    assert shown["stall (GPU hours)"].iloc[0] == "578.3"
    assert shown["mean drift per step"].iloc[0] == "4.13e-06"


def test_a_column_already_in_words_keeps_its_name_and_strings_stay_strings():
    frame = pd.DataFrame({"from TB": [0.5], "setting": ["every 14"], "interval": ["0.1..2"]})
    assert list(tables.readable(frame).strings().columns) == ["from TB", "setting", "interval"]


def test_styled_shows_the_same_text_as_readable():
    frame = pd.DataFrame({"useful_s": [475914.8592], "params": [11918592]})
    html = tables.styled(frame).to_html()
    assert "132.2" in html and "11,918,592" in html and "475914" not in html


def test_no_header_is_snake_case():
    for name in tables.WORDS:
        column, = tables.readable(pd.DataFrame({name: [1.0]})).frame.columns
        assert not re.search(r"[a-z]_[a-z]", column), column
