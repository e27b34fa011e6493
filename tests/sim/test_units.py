import pytest

from sim.errors import SimError
from sim.units import format_duration, parse_duration, parse_range


@pytest.mark.parametrize("text,seconds", [("36s", 36), ("30m", 1800), ("0.5h", 1800), ("2d", 172800),
                                          ("90", 90), ("1.5e1s", 15), ("250ms", 0.25), ("10min", 600)])
def test_units(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["-1", "5x", "", "h", "0", "1h30m", "inf"])
def test_bad_durations_say_how(text):
    with pytest.raises(SimError, match="duration"):
        parse_duration(text, what="--mtbf")


def test_range():
    assert parse_range("0.01h..3h") == (36.0, 10800.0)
    with pytest.raises(SimError, match="LOW..HIGH"):
        parse_range("3h")
    with pytest.raises(SimError, match="below"):
        parse_range("3h..1h")


def test_format():
    assert [format_duration(s) for s in (36, 1800, 5400, 172800)] == ["36s", "30m", "1.5h", "2d"]


def test_durations_lie_from_a_nanosecond_to_1e18_seconds():
    from sim.units import MAX_DURATION_S, MIN_DURATION_S
    assert parse_duration("1e18s") == MAX_DURATION_S and parse_duration("1e-9") \
        == MIN_DURATION_S
    assert parse_duration("0", allow_zero=True) == 0.0
    for text in ("1.1e18s", "1e307s", "9e-10s", "1e-300", "9" * 400, "1e16d"):
        with pytest.raises(SimError, match="from 1 ns to 1e18 s"):
            parse_duration(text, what="--mtbf")
    with pytest.raises(SimError, match="must be 0 or a duration from 1 ns to 1e18 s"):
        parse_duration("1e300d", what="--restart", allow_zero=True)
    for value in (1e307, 5e-324, float("nan"), 10**400):
        with pytest.raises(SimError, match="from 1 ns to 1e18 s"):
            parse_duration(value)
