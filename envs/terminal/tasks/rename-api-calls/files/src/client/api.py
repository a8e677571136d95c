"""HTTP client helpers."""


def fetch_data(url, timeout=10):
    """Downloads a resource."""
    return {"url": url, "timeout": timeout}


def prefetch_data(urls):
    """Warms the cache; not part of the rename."""
    return [fetch_data(u) for u in urls]
