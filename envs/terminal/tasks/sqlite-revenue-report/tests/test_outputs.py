"""Checks the 2023 revenue report and the shipped_2023 view."""
import sqlite3
from pathlib import Path

EXPECTED = [
    "customer,country,orders,revenue",
    "Donald Knuth,US,5,2280.91",
    "Ada Lovelace,UK,7,2130.58",
    "Edsger Dijkstra,NL,2,1799.72",
    "Alan Turing,UK,3,1281.02",
    "Barbara Liskov,US,5,1274.26",
    "Niklaus Wirth,CH,3,452.75",
    "Frances Allen,US,1,279.65",
    "Margaret Hamilton,US,3,275.91",
    "Grace Hopper,US,2,182.50"
]


def test_report_header_and_rows():
    lines = [l.rstrip("\r") for l in Path("/app/report.csv").read_text().splitlines() if l.strip()]
    assert lines[0] == EXPECTED[0]
    assert lines[1:] == EXPECTED[1:]


def test_view_rows():
    con = sqlite3.connect("file:/app/shop.db?mode=ro", uri=True)
    try:
        cur = con.execute("SELECT * FROM shipped_2023")
        columns = [d[0] for d in cur.description]
        rows = cur.fetchall()
    finally:
        con.close()
    assert columns == ["customer", "country", "orders", "revenue"]
    got = [f"{a},{b},{int(c)},{float(d):.2f}" for a, b, c, d in rows]
    assert got == EXPECTED[1:]


def test_tables_unchanged():
    con = sqlite3.connect("file:/app/shop.db?mode=ro", uri=True)
    try:
        counts = [con.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                  for t in ("customers", "orders", "order_items")]
        kinds = dict(con.execute("SELECT name, type FROM sqlite_master WHERE name = 'shipped_2023'").fetchall())
    finally:
        con.close()
    assert counts == [10, 70, 181]
    assert kinds == {"shipped_2023": "view"}
