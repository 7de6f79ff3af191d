"""The server-rendered pages (their behaviour in a real browser is in test_browser.py)."""

import dataclasses
import json
import re
import uuid

from tests.web.access.support import bearer, signed_in
from web.access import api_keys
from web.models import Job, Voice, db


def test_the_form_page_offers_every_setting(client):
    page = client.get("/").get_data(as_text=True)
    for element in (
        'id="text"',
        'id="char-count"',
        'id="catalog-voice"',
        'id="voice-seed"',
        'id="roll-voice"',
        'id="format"',
        'id="speed"',
        'id="temperature"',
        'id="top_p"',
        'id="top_k"',
        'id="refine_text"',
    ):
        assert element in page


def test_the_form_page_and_the_api_description_say_which_ssml_the_text_may_be(client):
    page = client.get("/").get_data(as_text=True)
    assert 'aria-describedby="ssml-help"' in page and 'id="ssml-help"' in page
    api = json.dumps(client.get("/api/openapi.json").get_json())
    for described in (page, api):
        for said in ("&lt;break time=", "x-strong 1250 ms", "at most 10 s a break, 60 s a text", "x-slow 1"):
            assert said in described.replace("<", "&lt;")


def test_every_page_warns_that_synthetic_weights_speak_noise(client):
    for path in ("/", "/jobs", "/voices"):
        assert "synthetic (random) weights" in client.get(path).get_data(as_text=True)


def test_an_unknown_job_page_is_a_404(client):
    assert client.get("/jobs/no-such-job").status_code == 404


def test_catalog_names_and_tags_are_escaped(client, app):
    with app.app_context():
        db.session.add(Voice(name="<script>alert(1)</script>", spk_emb="蘁淰敕欀" * 8))
        db.session.commit()
    for path in ("/", "/voices"):
        page = client.get(path).get_data(as_text=True)
        assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_with_keys_on_the_catalog_page_offers_changes_only_of_voices_the_signed_in_key_may_change(app):
    app.config["SETTINGS"] = dataclasses.replace(app.config["SETTINGS"], require_api_key=True)
    with app.app_context():
        alice, bob = api_keys.create_key("alice"), api_keys.create_key("bob")
    for key, name in ((alice, "Alice's"), (bob, "Bob's")):
        made = app.test_client().post(
            "/api/voices", json={"name": name, "spk_emb": "蘁淰敕欀" * 8}, headers=bearer(key)
        )
        assert made.status_code == 201
    browser, _ = signed_in(app, alice)
    page = browser.get("/voices").get_data(as_text=True)
    rows = dict(re.findall(r'<tr class="voice"[^>]*data-voice-name="([^"]+)"(.*?)</tr>', page, re.DOTALL))
    assert set(rows) == {"Alice&#39;s", "Bob&#39;s"}
    assert "voice-save" in rows["Alice&#39;s"] and "voice-delete" in rows["Alice&#39;s"]
    assert "voice-save" not in rows["Bob&#39;s"] and "voice-delete" not in rows["Bob&#39;s"]
    assert "voice-preview" in rows["Bob&#39;s"] and "disabled" in rows["Bob&#39;s"]


def test_the_favicon_answers_where_browsers_ask_for_it_even_before_sign_in(client, make_app):
    for app_client in (client, make_app(require_api_key=True).test_client()):
        linked = re.search(r'rel="icon" href="([^"]+)"', app_client.get("/sign-in").get_data(as_text=True)).group(1)
        for path in ("/favicon.ico", linked):
            answer = app_client.get(path)
            assert answer.status_code == 200 and answer.mimetype == "image/svg+xml", path
            assert answer.get_data().startswith(b"<svg")


def test_a_jobs_page_names_its_catalog_voice_with_a_link_to_it_and_its_format(client, app):
    with app.app_context():
        voice = Voice(name="Warm narrator", spk_emb="蘁淰敕欀" * 8, seed=41)
        db.session.add(voice)
        db.session.flush()
        named_id, seeded_id = str(uuid.uuid4()), str(uuid.uuid4())
        db.session.add(Job(id=named_id, text="Hi.", parameters={}, format="ogg", voice_id=voice.id, voice_seed=41))
        db.session.add(Job(id=seeded_id, text="Hi.", parameters={}, format="wav", voice_seed=2222))
        db.session.commit()

    named = client.get(f"/jobs/{named_id}").get_data(as_text=True)
    seeded = client.get(f"/jobs/{seeded_id}").get_data(as_text=True)

    assert re.search(r'<a href="/voices\?q=Warm\+narrator">Warm narrator</a>\s*\(seed 41\)', named)
    assert '<dd id="fact-format">ogg</dd>' in named and f'download="chattts-{named_id}.ogg"' in named
    assert re.search(r'<dd id="fact-voice">\s*seed 2222\s*</dd>', seeded)
