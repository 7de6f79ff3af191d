"""The voice workshop: one request speaks a sentence in new random voices, submitted all or none."""

import dataclasses

import pytest

from chattts_farm.contract import PRIORITY_QUEUES
from tests.web.access.support import bearer, make_key, well_inside_a_minute
from tests.web.test_admission import capped_app, queued_messages, reserved_jobs, waiting
from web.voices import WORKSHOP_TEXT, WORKSHOP_VOICES_DEFAULT, WORKSHOP_VOICES_MAX


def test_the_workshop_speaks_one_sentence_in_as_many_new_voices_as_asked_all_in_one_queue(
    tiny_settings, tmp_path, idle_redis_url
):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url)
    client = app.test_client()

    default = client.post("/api/voices/workshop", json={})
    chosen = client.post("/api/voices/workshop", json={"text": "Pick me.", "count": 3})

    assert default.status_code == 202 and chosen.status_code == 202
    made = default.get_json()["jobs"]
    assert len(made) == WORKSHOP_VOICES_DEFAULT and {job["text"] for job in made} == {WORKSHOP_TEXT}
    assert len({job["voice"]["seed"] for job in made}) == WORKSHOP_VOICES_DEFAULT  # each its own new voice
    assert [job["text"] for job in chosen.get_json()["jobs"]] == ["Pick me."] * 3
    # Sent back to back (Redis's queue lists hold the newest first), so that a worker takes them together;
    # interactive: someone waits at the page.
    assert set(queued_messages(app, PRIORITY_QUEUES["interactive"])[:3]) == {
        job["id"] for job in chosen.get_json()["jobs"]
    }


def test_the_workshop_speaks_the_voices_named_first_then_as_many_new_ones_as_asked(
    tiny_settings, tmp_path, idle_redis_url
):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url)
    client = app.test_client()

    named_only = client.post("/api/voices/workshop", json={"voices": ["alloy", "nova", 42]})
    beside_new = client.post("/api/voices/workshop", json={"text": "Pick me.", "voices": ["verse"], "count": 2})

    assert named_only.status_code == 202 and beside_new.status_code == 202
    seeds = [job["voice"]["seed"] for job in named_only.get_json()["jobs"]]
    assert seeds == [390_000_000, 2_730_000_000, 42]  # the README's table; no new voices unless asked
    made = beside_new.get_json()["jobs"]
    assert [job["text"] for job in made] == ["Pick me."] * 3 and made[0]["voice"]["seed"] == 4_290_000_000
    assert set(queued_messages(app, PRIORITY_QUEUES["interactive"])[:3]) == {job["id"] for job in made}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"count": 0}, "count"),
        ({"count": WORKSHOP_VOICES_MAX + 1}, "count"),
        ({"count": "6"}, "count"),
        ({"count": True}, "count"),
        ({"count": 2.5}, "count"),
        ({"text": "   "}, "text"),
        ({"text": 42}, "text"),
        ({"voice": 7}, "voice"),
        ({"voices": "alloy"}, "voices"),
        ({"voices": ["alloy"] * (WORKSHOP_VOICES_MAX + 1)}, "voices"),
        ({"voices": [True]}, "voices"),
        # Malformed before unknown: the fuzzer found a 422 for the name where the list was no list of voices.
        ({"voices": [":", True]}, "voices"),
        ({"voices": ["alloy"], "count": 0}, "count"),
        ([], "body"),
    ],
)
def test_a_bad_workshop_request_is_a_400_naming_its_field_and_queues_nothing(
    tiny_settings, tmp_path, idle_redis_url, body, field
):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url)

    answer = app.test_client().post("/api/voices/workshop", json=body)

    assert answer.status_code == 400 and answer.get_json()["field"] == field, answer.get_json()
    assert waiting(app) == 0 and app.test_client().get("/api/jobs").get_json()["jobs"] == []


def test_voices_past_the_queues_cap_are_refused_all_together_and_none_is_left_behind(
    tiny_settings, tmp_path, idle_redis_url
):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url, require_api_key=True, max_queued_jobs_per_key=4)
    client, key = app.test_client(), make_key(app, "auditioner")
    first = client.post("/api/voices/workshop", json={"count": 3}, headers=bearer(key))

    refused = client.post("/api/voices/workshop", json={"count": 2}, headers=bearer(key))  # 3 + 2 > 4

    assert first.status_code == 202 and refused.status_code == 429 and refused.headers["Retry-After"]
    accepted = {job["id"] for job in first.get_json()["jobs"]}
    assert {job["id"] for job in client.get("/api/jobs", headers=bearer(key)).get_json()["jobs"]} == accepted
    assert waiting(app) == 3 and reserved_jobs(app, key) == accepted
    assert client.post("/api/voices/workshop", json={"count": 1}, headers=bearer(key)).status_code == 202


def test_a_workshop_voice_is_its_keys_own(tiny_settings, tmp_path, idle_redis_url):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url, require_api_key=True)
    client, ann, bob = app.test_client(), make_key(app, "ann"), make_key(app, "bob")

    (job,) = client.post("/api/voices/workshop", json={"count": 1}, headers=bearer(ann)).get_json()["jobs"]

    assert client.get(job["status_url"], headers=bearer(ann)).status_code == 200
    assert client.get(job["status_url"], headers=bearer(bob)).status_code == 404
    assert client.post("/api/voices/workshop", json={"count": 1}).status_code == 401


def test_the_rate_limit_counts_a_workshops_jobs_not_its_one_request(tiny_settings, tmp_path, idle_redis_url):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url, require_api_key=True)
    app.config["SETTINGS"] = dataclasses.replace(app.config["SETTINGS"], rate_limit_per_minute=4)
    client, ann, bob = app.test_client(), make_key(app, "ann"), make_key(app, "bob")
    well_inside_a_minute()

    too_many = client.post("/api/voices/workshop", json={"count": 5}, headers=bearer(ann))
    four = client.post("/api/voices/workshop", json={"count": 4}, headers=bearer(bob))
    after_four = client.post("/api/jobs", json={"text": "One more."}, headers=bearer(bob))

    assert too_many.status_code == 429 and too_many.get_json()["field"] == "Authorization"
    assert 1 <= int(too_many.headers["Retry-After"]) <= 60 and "a minute" in too_many.get_json()["error"]
    assert client.get("/api/jobs", headers=bearer(ann)).get_json()["jobs"] == [] and reserved_jobs(app, ann) == set()
    assert four.status_code == 202 and len(four.get_json()["jobs"]) == 4
    assert after_four.status_code == 429
    # All or none: ann's refused workshop counted as its one request, so three jobs fit still.
    assert client.post("/api/voices/workshop", json={"count": 3}, headers=bearer(ann)).status_code == 202
