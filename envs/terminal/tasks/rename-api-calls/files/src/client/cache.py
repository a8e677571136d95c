from client.api import fetch_data, prefetch_data


def cached(url, store={}):
    if url not in store:
        store[url] = fetch_data(url)
    return store[url]


def warm(urls):
    return prefetch_data(urls)
