import pytest

from inikit.config import Config

TEXT = """\
timeout = 30
verbose = no

[server]
host = example.org
port = 8080
debug = yes

[client]
timeout = 5
"""


@pytest.fixture
def config():
    return Config.from_text(TEXT)


def test_sections_skip_default(config):
    assert config.sections() == ["server", "client"]


def test_get_string(config):
    assert config.get("server", "host") == "example.org"


def test_get_falls_back_to_default_section(config):
    assert config.get("server", "timeout") == "30"
    assert config.get("client", "timeout") == "5"


def test_get_missing_key(config):
    with pytest.raises(KeyError):
        config.get("server", "user")
    assert config.get("server", "user", "nobody") == "nobody"


def test_get_int(config):
    assert config.get_int("server", "port") == 8080
    assert config.get_int("server", "retries", 3) == 3


def test_get_int_rejects_words(config):
    with pytest.raises(ValueError):
        config.get_int("server", "host")


def test_get_bool(config):
    assert config.get_bool("server", "debug") is True
    assert config.get_bool("client", "verbose") is False
    assert config.get_bool("client", "missing", True) is True


def test_get_bool_rejects_other_words(config):
    with pytest.raises(ValueError):
        config.get_bool("server", "host")
