from client.api import fetch_data

URLS = ["https://example.com/a", "https://example.com/b"]


def run():
    return [fetch_data(u, timeout=30) for u in URLS]
