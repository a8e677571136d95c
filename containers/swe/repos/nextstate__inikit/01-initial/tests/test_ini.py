import pytest

from inikit.errors import ParseError
from inikit.ini import DEFAULT, parse_ini


def test_sections_and_keys():
    text = "[server]\nhost = example.org\nport=8080\n\n[client]\nretries = 3\n"
    assert parse_ini(text) == {"server": {"host": "example.org", "port": "8080"},
                               "client": {"retries": "3"}}


def test_keys_before_first_section_go_to_default():
    assert parse_ini("debug = no\n[a]\nx = 1\n") == {DEFAULT: {"debug": "no"}, "a": {"x": "1"}}


def test_comments_and_blank_lines_are_skipped():
    assert parse_ini("# one\n; two\n\n[s]\n  # three\nk = v\n") == {"s": {"k": "v"}}


def test_keys_are_lower_cased_and_last_one_wins():
    assert parse_ini("[s]\nName = a\nNAME = b\n") == {"s": {"name": "b"}}


def test_empty_section_is_kept():
    assert parse_ini("[empty]\n") == {"empty": {}}


def test_unclosed_header_reports_line():
    with pytest.raises(ParseError) as err:
        parse_ini("[ok]\nk = v\n[broken\n")
    assert err.value.lineno == 3


def test_line_without_equals_is_an_error():
    with pytest.raises(ParseError, match="expected"):
        parse_ini("[s]\njust words\n")
