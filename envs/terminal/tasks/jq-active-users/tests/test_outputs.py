"""Checks the active-user names and the admin e-mail list."""
import json
from pathlib import Path


def test_active_names():
    names = Path("/app/active_names.txt").read_text().splitlines()
    assert [n.strip() for n in names if n.strip()] == [
        "Aria Silva", "Ava Patel", "Isla Novak", "Maya Chen", "Noah Kim", "Omar Haddad",
    ]


def test_admin_emails():
    emails = json.loads(Path("/app/admins.json").read_text())
    assert emails == ["maya@example.com", "zoe@example.com", "ava@example.com",
                      "ben@example.com", "felix@example.com"]
