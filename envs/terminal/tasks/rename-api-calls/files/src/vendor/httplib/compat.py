# Third-party code: never edit.
def fetch_data(url):
    return url
