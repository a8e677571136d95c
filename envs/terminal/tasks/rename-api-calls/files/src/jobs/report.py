from client.api import fetch_data_v2  # the new API, already migrated


def build(url):
    data = fetch_data_v2(url)
    return {"rows": data}
