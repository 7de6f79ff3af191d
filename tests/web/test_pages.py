"""The server-rendered pages (their behaviour in a real browser is in test_browser.py)."""

from web.models import Voice, db


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
