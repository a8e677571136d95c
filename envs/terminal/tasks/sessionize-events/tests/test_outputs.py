"""Checks the SQLite load and the per-user session summary."""
import json
import sqlite3
from pathlib import Path

import pytest

EXPECTED = json.loads(r'''{
 "u01": {
  "sessions": 4,
  "events": 11,
  "revenue": 24.5,
  "longest_session_seconds": 4799
 },
 "u02": {
  "sessions": 4,
  "events": 14,
  "revenue": 22.75,
  "longest_session_seconds": 4318
 },
 "u03": {
  "sessions": 7,
  "events": 17,
  "revenue": 249.99,
  "longest_session_seconds": 1829
 },
 "u04": {
  "sessions": 4,
  "events": 8,
  "revenue": 15.25,
  "longest_session_seconds": 1920
 },
 "u05": {
  "sessions": 5,
  "events": 13,
  "revenue": 0,
  "longest_session_seconds": 1920
 },
 "u06": {
  "sessions": 7,
  "events": 9,
  "revenue": 47.99,
  "longest_session_seconds": 1920
 }
}''')


def query(sql: str) -> list[tuple]:
    con = sqlite3.connect("file:/app/events.db?mode=ro", uri=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_events_table_loaded():
    assert query("SELECT COUNT(*) FROM events") == [(72,)]
    columns = [(r[1], r[2].upper()) for r in query("PRAGMA table_info(events)")]
    assert columns == [("user_id", "TEXT"), ("ts", "TEXT"), ("event", "TEXT"), ("amount", "REAL")]
    assert query("SELECT COUNT(*) FROM events WHERE event = 'purchase' AND typeof(amount) = 'real'") == [(13,)]
    assert query("SELECT COUNT(*) FROM events WHERE ts LIKE '____-__-__T__:__:__Z'") == [(72,)]


def test_empty_amounts_are_null():
    assert query("SELECT COUNT(*) FROM events WHERE amount IS NULL") == [(59,)]


def test_users():
    assert sorted(json.loads(Path("/app/sessions.json").read_text())) == sorted(EXPECTED)


@pytest.mark.parametrize("user", sorted(EXPECTED))
def test_user_summary(user):
    got = json.loads(Path("/app/sessions.json").read_text())[user]
    want = EXPECTED[user]
    assert got["sessions"] == want["sessions"]
    assert got["events"] == want["events"]
    assert got["revenue"] == pytest.approx(want["revenue"], abs=0.006)
    assert got["longest_session_seconds"] == want["longest_session_seconds"]
