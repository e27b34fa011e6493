"""dashboard.downloads."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard.downloads import csv_bytes, filename, html_bytes, human_bytes


def test_csv_and_html():
    assert csv_bytes(pd.DataFrame({"a": [1, 2]})) == b"a\n1\n2\n"
    html = html_bytes(go.Figure(go.Bar(x=[1], y=[2])))
    assert b"<html>" in html[:200] and b"Plotly.newPlot" in html


def test_names_and_sizes():
    assert filename("qwen 2.5/7b", "io", ext="csv") == "qwen_2.5_7b-io.csv"
    assert human_bytes(999) == "999 B"
    assert human_bytes(4.35e9) == "4.35 GB"
