"""Checks the ERROR count and the list of components that logged errors."""
import hashlib
from pathlib import Path

LOG_SHA256 = "376c3b71b1140f5115ecb7409ad23b01414d64091afbaf8fff4d2e5aea4166d6"


def test_error_count():
    text = Path("/app/error_count.txt").read_text()
    assert text.strip() == "33"


def test_error_components():
    lines = Path("/app/error_components.txt").read_text().split()
    assert lines == ["api", "auth", "cache", "db", "scheduler"]


def test_log_untouched_and_outputs_exist():
    assert Path("/app/error_count.txt").is_file()
    digest = hashlib.sha256(Path("/app/logs/app.log").read_bytes()).hexdigest()
    assert digest == LOG_SHA256
