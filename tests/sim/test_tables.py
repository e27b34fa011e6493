"""``sim.tables``: tables that fit 100 columns, in blocks that repeat the row's name."""
from sim.tables import WIDTH, Column, render

COLUMNS = [Column("strategy", 15, left=True), *(Column(f"column {i}", 12) for i in range(10))]
ROWS = [["gemini", *(f"{i}.0" for i in range(10))], ["none", "-"]]


def test_a_wide_table_is_cut_into_blocks_that_fit_and_repeat_the_name():
    text = render(COLUMNS, ROWS)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= WIDTH
    blocks = text.split("\n\n")
    assert len(blocks) == 2
    for block in blocks:
        head, rule, *rows = block.splitlines()
        assert head.startswith("strategy") and set(rule) == {"-"}
        assert [r.split()[0] for r in rows] == ["gemini", "none"]
    assert sum(b.count("column ") for b in blocks) == 10     # every column once


def test_wide_prints_one_line_a_row():
    lines = render(COLUMNS, ROWS, width=None).splitlines()
    assert len(lines) == 4 and len(lines[0]) > WIDTH
    assert lines[2].split() == ["gemini", *(f"{i}.0" for i in range(10))]
    assert lines[3].split() == ["none", "-"]                 # a short row leaves the rest blank


def test_a_table_that_fits_is_one_block_aligned_to_its_widest_cell():
    text = render([Column("name", left=True), Column("value")], [["a", "1"], ["bbbbbb", "22222"]])
    assert text.splitlines() == ["name   value", "------------", "a          1", "bbbbbb 22222"]
