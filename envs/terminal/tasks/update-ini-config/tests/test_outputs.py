"""Checks the edited INI file and the new .env file."""
import configparser
from pathlib import Path

INI = Path("/app/config/app.ini")


def load() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(INI.read_text())
    return parser


def test_changed_values():
    cfg = load()
    assert cfg["server"]["port"] == "9090"
    assert cfg["server"].getboolean("debug") is False
    assert cfg["logging"]["level"] == "WARNING"


def test_cache_section():
    cfg = load()
    assert cfg["cache"]["backend"] == "memory"
    assert cfg["cache"]["ttl"] == "300"


def test_other_values_and_comments_kept():
    cfg = load()
    assert cfg["server"]["host"] == "0.0.0.0" and cfg["server"]["workers"] == "4"
    assert cfg["database"]["url"] == "sqlite:////app/data/app.db"
    assert cfg["database"]["pool_size"] == "5"
    assert cfg["database"]["replica_port"] == "8080"
    assert cfg["logging"]["file"] == "/var/log/app.log"
    lines = INI.read_text().splitlines()
    assert lines[0] == "# Application settings -- managed by ops, keep this header."
    assert "# port of the read replica, not of the server" in lines
    assert set(cfg.sections()) == {"server", "database", "logging", "cache"}


def test_dotenv():
    lines = [l for l in Path("/app/config/.env").read_text().splitlines() if l.strip()]
    assert sorted(lines) == ["APP_ENV=production", "APP_PORT=9090"]
