"""The voice catalog API (embeddings of seeds come from a real worker)."""

import time

import pytest

pytestmark = pytest.mark.database  # on SQLite and on PostgreSQL


def add(client, **fields):
    answer = client.post("/api/voices", json=fields)
    assert answer.status_code == 201, answer.get_json()
    return answer.get_json()


def test_a_voice_from_a_seed_stores_the_embedding_a_worker_derives(client, workers):
    voice = add(client, name="Warm narrator", seed=42, tags=["Warm", " narrator ", "warm"], rating=4)
    assert voice["seed"] == 42 and len(voice["spk_emb"]) > 16
    assert voice["tags"] == ["narrator", "warm"]
    again = workers.client.send_task("chattts.voice_embedding", kwargs={"seed": 42}).get(timeout=30)
    assert voice["spk_emb"] == again


def test_voices_are_found_by_every_tag_and_by_text(client, workers):
    add(client, name="Calm", seed=1, tags=["calm", "female"], description="for bedtime stories")
    add(client, name="Bright", seed=2, tags=["bright", "female"])
    add(client, name="Deep", seed=3, tags=["calm", "male"])

    def names(query):
        return [v["name"] for v in client.get(f"/api/voices{query}").get_json()["voices"]]

    assert sorted(names("?tag=calm")) == ["Calm", "Deep"]
    assert names("?tag=calm&tag=FEMALE") == ["Calm"]
    assert names("?q=bedtime") == ["Calm"]
    assert names("?tag=nobody") == []


def test_a_voice_is_read_edited_and_deleted(client, workers):
    voice = add(client, name="Editable", seed=5)
    edited = client.patch(
        f"/api/voices/{voice['id']}", json={"name": "Edited", "tags": ["new"], "rating": 5, "favourite": True}
    ).get_json()
    assert (edited["name"], edited["tags"], edited["rating"], edited["favourite"]) == ("Edited", ["new"], 5, True)
    assert client.get(f"/api/voices/{voice['id']}").get_json()["name"] == "Edited"
    assert client.delete(f"/api/voices/{voice['id']}").status_code == 204
    assert client.get(f"/api/voices/{voice['id']}").status_code == 404
    assert client.get(f"/api/voices/{2**40}").status_code == 404  # past PostgreSQL's integers


@pytest.mark.parametrize(
    ("fields", "field", "status"),
    [
        ({"seed": 1}, "name", 400),
        ({"name": "X"}, "seed", 400),
        ({"name": "X", "seed": -1}, "seed", 400),
        ({"name": "X", "spk_emb": "not an embedding"}, "spk_emb", 400),
        ({"name": "X", "seed": 1, "rating": 9}, "rating", 400),
        ({"name": "X", "seed": 1, "tags": "calm"}, "tags", 400),
        ({"name": "X", "seed": 1, "colour": "red"}, "colour", 400),
    ],
)
def test_bad_voice_fields_are_named(client, workers, fields, field, status):
    answer = client.post("/api/voices", json=fields)
    assert answer.status_code == status and answer.get_json()["field"] == field


def test_names_are_unique(client, workers):
    add(client, name="Twin", seed=1)
    answer = client.post("/api/voices", json={"name": "Twin", "seed": 2})
    assert answer.status_code == 409 and answer.get_json()["field"] == "name"


def test_export_then_import_round_trips_and_skips_existing_names(client, app, workers):
    add(client, name="Kept", seed=7, tags=["a", "b"], description="kept voice", rating=3)
    exported = client.get("/api/voices/export")
    assert exported.mimetype == "application/json"
    entries = exported.get_json()
    client.delete(f"/api/voices/{client.get('/api/voices').get_json()['voices'][0]['id']}")
    assert client.post("/api/voices/import", json=entries).get_json() == {"added": ["Kept"], "skipped": []}
    assert client.post("/api/voices/import", json=entries).get_json() == {"added": [], "skipped": ["Kept"]}
    restored = client.get("/api/voices").get_json()["voices"][0]
    assert {k: restored[k] for k in entries[0]} == entries[0]
    assert client.post("/api/voices/import", json={"not": "a list"}).get_json()["field"] == "body"


def test_the_voice_of_a_finished_job_is_saved_and_usable_by_name(client, workers):
    job_id = client.post("/api/jobs", json={"text": "Keep my voice.", "voice": 77}).get_json()["id"]
    deadline = time.monotonic() + 60
    while client.get(f"/api/jobs/{job_id}").get_json()["status"] != "done":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    saved = client.post(f"/api/voices/from-job/{job_id}", json={"name": "From a job", "tags": ["kept"]})
    assert saved.status_code == 201 and saved.get_json()["seed"] == 77
    by_name = client.post("/api/jobs", json={"text": "Spoken by name.", "voice": "From a job"})
    assert by_name.status_code == 202
    assert client.post("/api/voices/from-job/nope", json={"name": "x"}).status_code == 404


def test_the_api_is_described_by_openapi(client):
    description = client.get("/api/openapi.json").get_json()
    assert description["openapi"].startswith("3.")
    for path in ("/api/jobs", "/api/jobs/{job_id}/audio", "/api/voices", "/api/voices/import", "/v1/audio/speech"):
        assert path in description["paths"]


def test_a_preview_is_generated_once_and_kept(client, workers):
    voice = add(client, name="Previewed", seed=9)
    first = client.post(f"/api/voices/{voice['id']}/preview")
    assert first.status_code in (200, 202)
    deadline = time.monotonic() + 60
    while client.get(first.get_json()["status_url"]).get_json()["status"] != "done":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    again = client.post(f"/api/voices/{voice['id']}/preview")
    assert again.status_code == 200 and again.get_json()["id"] == first.get_json()["id"]
    assert client.get(again.get_json()["result"]["audio_url"]).status_code == 200


def test_a_job_can_name_its_catalog_voice_by_id(client, workers):
    voice = add(client, name="By id", seed=11)
    answer = client.post("/api/jobs", json={"text": "Spoken by id.", "voice_id": voice["id"]})
    assert answer.status_code == 202
    assert client.post("/api/jobs", json={"text": "Hi.", "voice_id": 999}).get_json()["field"] == "voice_id"


EMBEDDING = "蘁淰敕欀" * 8


def test_a_tag_is_at_most_64_characters_as_stored_lower_cased(client):
    # "İ" lower-cases to two code points ("i" and a combining dot above).
    too_long = client.post("/api/voices", json={"name": "Dotted", "spk_emb": EMBEDDING, "tags": ["İ" * 64]})
    assert too_long.status_code == 400 and too_long.get_json()["field"] == "tags"
    fits = add(client, name="Dotted", spk_emb=EMBEDDING, tags=["İ" * 32])
    assert fits["tags"] == ["i\u0307" * 32]


def test_control_and_invisible_characters_are_dropped_from_catalog_text_as_from_job_texts(client):
    voice = add(
        client,
        name="Nul\x00 Esc\x1b[31m Bidi\u202e",
        spk_emb=EMBEDDING,
        tags=["zero\u200bwidth", "\x00"],
        description="a\u202ebc\x07",
        gender="fe\u2066male",
        age="ad\x1bult",
    )
    assert voice["name"] == "Nul Esc Bidi"
    assert voice["tags"] == ["zerowidth"]
    assert (voice["description"], voice["gender"], voice["age"]) == ("abc", "female", "adult")
    renamed = client.patch(f"/api/voices/{voice['id']}", json={"name": "\u202eRenamed\x00"}).get_json()
    assert renamed["name"] == "Renamed"
    nothing_left = client.post("/api/voices", json={"name": "\u202e\x00\u200b", "spk_emb": EMBEDDING})
    assert nothing_left.status_code == 400 and nothing_left.get_json()["field"] == "name"
    imported = client.post("/api/voices/import", json=[{"name": "Im\x00ported\u202e", "spk_emb": EMBEDDING}])
    assert imported.get_json()["added"] == ["Imported"]


def test_percent_underscore_and_backslash_in_the_search_text_are_literal(client):
    for name in ("100% sure", "100 sure", "snake_case", "snakeXcase", "back\\slash", "backslash"):
        add(client, name=name, spk_emb=EMBEDDING)

    def names(query):
        return [v["name"] for v in client.get("/api/voices", query_string={"q": query}).get_json()["voices"]]

    assert names("%") == ["100% sure"]
    assert names("_") == ["snake_case"]
    assert names("\\") == ["back\\slash"]
    assert names("e_c") == ["snake_case"]


def test_a_multipart_body_without_a_boundary_is_refused_as_a_body_not_as_a_cross_site_form(client):
    # No browser sends one; it is read as the JSON it is not (400), before any check that forms get.
    response = client.post("/api/voices", data=b"{}", content_type="multipart/form-data")
    assert response.status_code == 400, response.get_json()
    assert "error" in response.get_json()
