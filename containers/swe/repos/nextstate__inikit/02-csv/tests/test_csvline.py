import pytest

from inikit.csvline import join_line, split_line


def test_split_plain_fields():
    assert split_line("a,b,c") == ["a", "b", "c"]


def test_split_keeps_empty_fields():
    assert split_line(",x,") == ["", "x", ""]


def test_split_quoted_separator():
    assert split_line('"Doe, Jane",42') == ["Doe, Jane", "42"]


def test_split_other_separator():
    assert split_line("a;b;c", sep=";") == ["a", "b", "c"]


def test_split_unterminated_quote_raises():
    with pytest.raises(ValueError):
        split_line('"open,field')


def test_join_quotes_only_when_needed():
    assert join_line(["plain", "a,b", " pad"]) == 'plain,"a,b"," pad"'


def test_join_doubles_quotes():
    assert join_line(['say "hi"']) == '"say ""hi"""'


def test_round_trip_without_quotes():
    fields = ["Doe, Jane", "", "x"]
    assert split_line(join_line(fields)) == fields
