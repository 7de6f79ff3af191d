"""The catalog's kinds of voice (seed, embedding, clip, blend) and owners on the API, and its export and
import carrying every kind, against real CPU workers (synthetic-tiny)."""

import numpy as np
import pytest

from tests.voice_bombs import embedding_text
from tests.web.access.support import bearer, make_key
from tests.web.api.test_voice_blends import spoken
from tests.web.databases import fresh_database
from web import voices

pytestmark = pytest.mark.database  # on SQLite and on PostgreSQL

# A speaker embedding as wide as synthetic-tiny's (64 values), which its workers can mix.
EMBEDDING = embedding_text(np.random.default_rng(7).standard_normal(64).astype(np.float16).tobytes())


def add(client, headers=None, **fields):
    answer = client.post("/api/voices", json=fields, headers=headers)
    assert answer.status_code == 201, answer.get_json()
    return answer.get_json()


def names(client, query=""):
    answer = client.get(f"/api/voices{query}")
    assert answer.status_code == 200, answer.get_json()
    return sorted(voice["name"] for voice in answer.get_json()["voices"])


def test_each_voice_says_its_kind_and_a_blend_lists_its_parts_by_name(client, workers):
    calm = add(client, name="calm", seed=9)
    flat = add(client, name="flat", spk_emb=EMBEDDING)
    mix = [{"voice": "calm", "weight": 0.7}, {"voice": 42, "weight": 0.3}, {"voice": "flat", "weight": 1}]
    blend = add(client, name="calm, 42 and flat", mix=mix)

    assert [(voice["kind"], voice["mix"]) for voice in (calm, flat)] == [("seed", None), ("embedding", None)]
    assert blend["kind"] == "blend" and blend["seed"] is None
    assert blend["mix"] == [
        {"voice": "calm", "weight": 0.7, "voice_id": calm["id"]},
        {"voice": 42, "weight": 0.3},
        {"voice": "flat", "weight": 1.0, "voice_id": flat["id"]},
    ]
    assert client.get(f"/api/voices/{blend['id']}").get_json()["mix"] == blend["mix"]

    # A part renamed is listed by its new name; a part deleted by the embedding the blend mixed.
    client.patch(f"/api/voices/{calm['id']}", json={"name": "serene"})
    client.delete(f"/api/voices/{flat['id']}")
    parts = client.get(f"/api/voices/{blend['id']}").get_json()["mix"]
    assert parts == [
        {"voice": "serene", "weight": 0.7, "voice_id": calm["id"]},
        {"voice": 42, "weight": 0.3},
        {"voice": EMBEDDING, "weight": 1.0},
    ]


def test_voices_are_found_by_kind_and_an_unknown_kind_is_refused_naming_it(client, workers):
    add(client, name="calm", seed=9)
    add(client, name="flat", spk_emb=EMBEDDING)
    add(client, name="blended", mix=[{"voice": "calm"}, {"voice": "flat"}], tags=["mixed"])

    assert names(client, "?kind=seed") == ["calm"]
    assert names(client, "?kind=embedding") == ["flat"]
    assert names(client, "?kind=blend&tag=mixed") == ["blended"]
    assert names(client, "?kind=clip") == []  # tests/web/api/test_voice_clips.py finds clip voices
    refused = client.get("/api/voices?kind=sampled")
    assert refused.status_code == 400 and refused.get_json()["field"] == "kind"
    assert "seed, embedding, clip, blend" in refused.get_json()["error"]


def test_a_voice_kept_from_a_blend_job_is_a_blend_of_the_parts_the_job_mixed(client, workers):
    mix = [{"voice": "alloy", "weight": 2}, {"voice": 42}]
    job = spoken(client, {"mix": mix})[1]
    kept = client.post(f"/api/voices/from-job/{job['id']}", json={"name": "kept blend"}).get_json()
    assert kept["kind"] == "blend" and kept["spk_emb"] == add(client, name="made blend", mix=mix)["spk_emb"]
    assert kept["mix"] == [{"voice": 390_000_000, "weight": 2.0}, {"voice": 42, "weight": 1.0}]


def test_a_voice_names_the_key_that_made_it_as_its_owner(make_app, workers):
    app = make_app(require_api_key=True, rate_limit_per_minute=1000)
    client = app.test_client()
    alice = make_key(app, "alice")
    made = add(client, headers=bearer(alice), name="Alice's", spk_emb=EMBEDDING)
    assert made["owner"] == "alice"
    seen_by_bob = client.get(f"/api/voices/{made['id']}", headers=bearer(make_key(app, "bob"))).get_json()
    assert (seen_by_bob["owner"], seen_by_bob["editable"]) == ("alice", False)


def test_with_keys_off_voices_have_no_owner(client):
    assert add(client, name="anyone's", spk_emb=EMBEDDING)["owner"] is None


def another_farm(make_app, database_url, request, tmp_path):
    """An app of its own on a fresh database of the test's kind, beside the test's ``client``'s."""
    kind = "sqlite" if database_url.startswith("sqlite") else "postgresql"
    directory = tmp_path / "another-farm"
    directory.mkdir()
    return make_app(database_url=fresh_database(kind, request, directory), data_dir=directory).test_client()


def test_every_kind_exports_and_imports_into_a_fresh_farm_where_the_blend_speaks_the_same(
    client, make_app, database_url, request, tmp_path, workers
):
    add(client, name="calm", seed=9, tags=["soft"])
    add(client, name="flat", spk_emb=EMBEDDING, description="an embedding")
    # A favourite, so exported before its parts: the import resolves them wherever they come in the list.
    mix = [{"voice": "calm", "weight": 0.7}, {"voice": 42, "weight": 0.3}, {"voice": "flat"}]
    add(client, name="a blend", mix=mix, favourite=True, rating=4)
    exported = client.get("/api/voices/export").get_json()
    assert [(entry["name"], entry["kind"]) for entry in exported] == [
        ("a blend", "blend"),
        ("calm", "seed"),
        ("flat", "embedding"),
    ]
    blend_entry, seed_entry, embedding_entry = exported
    assert blend_entry["mix"] == [
        {"voice": "calm", "weight": 0.7},
        {"voice": 42, "weight": 0.3},
        {"voice": "flat", "weight": 1.0},
    ]
    assert "spk_emb" not in blend_entry and "owner" not in blend_entry and "id" not in blend_entry
    assert (blend_entry["favourite"], blend_entry["rating"]) == (True, 4)
    assert (seed_entry["seed"], seed_entry["tags"]) == (9, ["soft"])
    assert embedding_entry["spk_emb"] == EMBEDDING and "seed" not in embedding_entry

    other = another_farm(make_app, database_url, request, tmp_path)
    imported = other.post("/api/voices/import", json=exported)
    assert imported.status_code == 200, imported.get_json()
    assert sorted(imported.get_json()["added"]) == ["a blend", "calm", "flat"]

    def catalog(farm):
        return {
            voice["name"]: (voice["kind"], voice["seed"], voice["spk_emb"], voice["tags"], voice["favourite"])
            for voice in farm.get("/api/voices").get_json()["voices"]
        }

    assert catalog(other) == catalog(client)
    assert other.get("/api/voices/export").get_json() == exported
    here, _ = spoken(client, "a blend")
    there, _ = spoken(other, "a blend")
    # Equal up to the float rounding batch mates bring (as tests/web/api/test_voice_blends.py allows).
    np.testing.assert_allclose(there, here, atol=2e-3)


def test_an_import_with_a_blend_whose_part_is_missing_is_refused_naming_the_part_and_adds_nothing(client):
    entries = [
        {"name": "flat", "kind": "embedding", "spk_emb": EMBEDDING, "tags": ["new"]},
        {"name": "a blend", "kind": "blend", "mix": [{"voice": "flat"}, {"voice": "gone", "weight": 2}]},
    ]
    refused = client.post("/api/voices/import", json=entries)
    assert refused.status_code == 422 and refused.get_json()["field"] == "mix"
    assert "voice 1 ('a blend')" in refused.get_json()["error"] and "'gone'" in refused.get_json()["error"]
    assert names(client) == [] and client.get("/voices").status_code == 200


def test_an_import_whose_blend_no_worker_mixes_adds_nothing(make_app, idle_redis_url, monkeypatch):
    monkeypatch.setattr(voices, "EMBEDDING_TIMEOUT_S", 0.5)  # no worker reads this Redis database
    client = make_app(redis_url=idle_redis_url).test_client()
    entries = [{"name": "flat", "spk_emb": EMBEDDING}, {"name": "a blend", "mix": [{"voice": "flat"}, {"voice": 3}]}]
    refused = client.post("/api/voices/import", json=entries)
    assert refused.status_code == 503 and refused.get_json()["field"] == "mix"
    assert names(client) == []


IMPORTS_REFUSED = {
    "a blend with an embedding": ({"name": "b", "mix": [{"voice": 1}], "spk_emb": EMBEDDING}, "spk_emb"),
    "a kind its fields are not": ({"name": "e", "kind": "seed", "spk_emb": EMBEDDING}, "kind"),
    "a clip voice of an embedding": ({"name": "c", "kind": "clip", "spk_emb": EMBEDDING}, "kind"),
    "a blend of all weights 0": ({"name": "z", "mix": [{"voice": 1, "weight": 0}]}, "mix"),
    "neither an embedding nor a mix": ({"name": "n", "seed": 3}, "body"),
}


@pytest.mark.parametrize(("entry", "field"), IMPORTS_REFUSED.values(), ids=IMPORTS_REFUSED)
def test_an_import_of_a_voice_of_no_kind_it_can_make_is_refused_naming_the_field(client, entry, field):
    refused = client.post("/api/voices/import", json=[{"name": "fine", "spk_emb": EMBEDDING}, entry])
    assert refused.status_code == 400 and refused.get_json()["field"] == field, refused.get_json()
    assert names(client) == []


def test_voices_of_one_import_share_a_tag_new_to_the_catalog(client):
    entries = [{"name": name, "spk_emb": EMBEDDING, "tags": ["new", "shared"]} for name in ("one", "two")]
    assert client.post("/api/voices/import", json=entries).get_json() == {"added": ["one", "two"], "skipped": []}
    assert names(client, "?tag=shared") == ["one", "two"]
