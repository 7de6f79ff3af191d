"""Helpers of the access tests: a key made on an app, and the header that sends it."""

from web.access import api_keys


def make_key(app, name):
    with app.app_context():
        return api_keys.create_key(name)


def bearer(key):
    return {"Authorization": f"Bearer {key}"}
