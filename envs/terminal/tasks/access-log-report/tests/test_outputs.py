"""Checks the three access-log reports."""
import json
from pathlib import Path

TOP = ["139 10.0.2.11", "109 10.0.1.78", "68 192.168.1.7", "45 10.0.0.253", "45 10.0.1.132"]
STATUS = {"200": 460, "301": 9, "304": 48, "404": 63, "500": 12, "502": 7, "503": 1}
ERROR_PATHS = ["/api/orders", "/api/orders/17", "/api/search", "/api/users", "/login"]


def test_top_ips():
    lines = [" ".join(l.split()) for l in Path("/app/report/top_ips.txt").read_text().splitlines() if l.strip()]
    assert lines == TOP


def test_status_counts():
    counts = json.loads(Path("/app/report/status_counts.json").read_text())
    assert counts == STATUS
    assert all(isinstance(v, int) for v in counts.values())


def test_server_error_paths():
    lines = [l.strip() for l in Path("/app/report/server_errors.txt").read_text().splitlines() if l.strip()]
    assert lines == ERROR_PATHS
