"""Batches: up to 10,000 jobs in one request, validated whole before any exists, run as bulk work by real
CPU workers (synthetic-tiny), read back with counts and progress, fetched as one streamed zip, cancelled
together; a refused batch leaves nothing behind."""

import dataclasses
import io
import json
import time
import zipfile
from datetime import timedelta

import pytest

from chattts_farm.contract import PRIORITY_QUEUES
from tests.web.access.support import bearer, make_key, well_inside_a_minute
from tests.web.test_admission import capped_app, queued_messages, reserved_jobs, waiting
from web import retention
from web.batches import MAX_ITEMS
from web.models import Batch, Job, db, utcnow
from worker.audio import decode

pytestmark = pytest.mark.database  # on SQLite and on PostgreSQL

LONG_TEXT = " ".join(f"Sentence {word} of a long item." for word in "abcdefghijklmnopqrstuvwxyz" * 2)
UPLOAD_HEADERS = {"X-CSRF-Token": "any"}  # with keys off, a form upload must carry it


def wait_for_batch(client, batch_id, status="done", timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = client.get(f"/api/batches/{batch_id}").get_json()
        if body["status"] == status:
            return body
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} stayed {body['status']}: {body['counts']}")


def jsonl(*items) -> bytes:
    return "".join(json.dumps(item) + "\n" for item in items).encode()


def rows(app, model) -> int:
    with app.app_context():
        return db.session.query(model).count()


def test_a_batchs_items_run_as_bulk_jobs_and_its_archive_holds_each_ones_audio_with_a_manifest(client, workers):
    answer = client.post(
        "/api/batches",
        json={
            "voice": "alloy",
            "format": "wav",
            "items": [
                {"text": "The first item.", "custom_id": "intro"},
                {"text": "The second item, in flac.", "format": "flac"},
                {"text": "The third item.", "custom_id": "outro", "voice": 42, "priority": "normal"},
            ],
        },
    )

    assert answer.status_code == 202, answer.get_json()
    created = answer.get_json()
    assert answer.headers["Location"] == created["status_url"] == f"/api/batches/{created['id']}"
    assert [item["custom_id"] for item in created["items"]] == ["intro", None, "outro"]
    done = wait_for_batch(client, created["id"])
    assert done["counts"] == {"queued": 0, "running": 0, "done": 3, "failed": 0, "cancelled": 0}
    assert done["progress"] == 1.0 and done["size"] == 3 and done["finished_at"] is not None
    jobs = [client.get(item["status_url"]).get_json() for item in done["items"]]
    assert [job["parameters"]["priority"] for job in jobs] == ["bulk", "bulk", "normal"]  # bulk unless told
    assert [job["voice"]["seed"] for job in jobs] == [390_000_000, 390_000_000, 42]  # alloy, the default

    archive = client.get(created["archive_url"])

    assert archive.status_code == 200 and archive.mimetype == "application/zip"
    assert f'filename="chattts-batch-{created["id"]}.zip"' in archive.headers["Content-Disposition"]
    with zipfile.ZipFile(io.BytesIO(archive.data)) as zipped:
        assert sorted(zipped.namelist()) == ["1.flac", "intro.wav", "manifest.json", "outro.wav"]
        manifest = json.loads(zipped.read("manifest.json"))
        assert manifest["batch_id"] == created["id"]
        assert [(entry["item"], entry["file"], entry["status"]) for entry in manifest["items"]] == [
            (0, "intro.wav", "done"),
            (1, "1.flac", "done"),
            (2, "outro.wav", "done"),
        ]
        for entry, job in zip(manifest["items"], jobs, strict=True):
            assert entry["job_id"] == job["id"] and entry["duration_s"] == job["result"]["duration_s"]
            audio = zipped.read(entry["file"])
            assert audio == client.get(job["audio_url"]).data
            samples, rate = decode(audio)
            assert abs(len(samples) / rate - entry["duration_s"]) < 0.05


def test_a_custom_id_that_is_another_items_place_does_not_take_its_file_in_the_archive(client, workers):
    created = client.post(
        "/api/batches", json={"items": [{"text": "Named one.", "custom_id": "1"}, {"text": "In place one."}]}
    ).get_json()
    wait_for_batch(client, created["id"])

    with zipfile.ZipFile(io.BytesIO(client.get(created["archive_url"]).data)) as zipped:
        manifest = json.loads(zipped.read("manifest.json"))["items"]
        assert [entry["file"] for entry in manifest] == ["1.wav", "1~1.wav"]
        assert sorted(zipped.namelist()) == ["1.wav", "1~1.wav", "manifest.json"]


def test_a_jsonl_upload_is_a_batch_as_json_is_with_its_defaults_beside_it(client, workers):
    answer = client.post(
        "/api/batches",
        data={
            "items": (
                io.BytesIO(jsonl({"text": "Line one.", "custom_id": "a"}, {"text": "Line two."}) + b"\n"),
                "b.jsonl",
            ),
            "defaults": json.dumps({"format": "mp3", "speed": 3}),
        },
        headers=UPLOAD_HEADERS,
    )

    assert answer.status_code == 202, answer.get_json()
    done = wait_for_batch(client, answer.get_json()["id"])
    assert [(item["custom_id"], item["status"]) for item in done["items"]] == [("a", "done"), (None, "done")]
    job = client.get(done["items"][1]["status_url"]).get_json()
    assert job["format"] == "mp3" and job["parameters"]["speed"] == 3 and job["text"] == "Line two."


def test_a_cancelled_batch_stops_every_item_and_its_archive_lists_them_without_files(client, workers):
    created = client.post("/api/batches", json={"items": [{"text": LONG_TEXT}] * 4}).get_json()

    cancelled = client.delete(created["status_url"])

    assert cancelled.status_code == 200
    body = cancelled.get_json()
    assert body["status"] == "cancelled" and body["cancelled_at"] is not None and body["finished_at"] is not None
    finished = body["counts"]["done"] + body["counts"]["cancelled"]
    assert finished == 4 and body["counts"]["cancelled"] >= 1  # a worker may finish an item first
    assert client.get(created["status_url"]).get_json()["status"] == "cancelled"
    with zipfile.ZipFile(io.BytesIO(client.get(created["archive_url"]).data)) as zipped:
        manifest = json.loads(zipped.read("manifest.json"))["items"]
        assert [entry["file"] for entry in manifest if entry["status"] == "cancelled"] == [None] * body["counts"][
            "cancelled"
        ]
        assert all(entry["error"] == "cancelled" for entry in manifest if entry["status"] == "cancelled")
    # Cancelling an ended batch changes nothing.
    assert client.delete(created["status_url"]).get_json()["counts"] == body["counts"]


BAD_BATCHES = [
    ({}, "items"),
    ({"items": "Hello."}, "items"),
    ({"items": []}, "items"),
    ({"items": [{"text": "Fine."}] * (MAX_ITEMS + 1)}, "items"),
    ({"items": [{"text": "Fine."}] * 5 + [{"text": "   "}]}, "items[5].text"),
    ({"items": [{"text": "Fine."}, "Not an object."]}, "items[1]"),
    ({"items": [{"text": "Fine.", "speed": 12}]}, "items[0].speed"),
    ({"speed": 12, "items": [{"text": "Fine."}, {"text": "Fine.", "speed": 3}]}, "speed"),
    ({"speed": 12, "items": [{"text": "Fine.", "speed": 3}]}, "speed"),  # a default is checked though unused
    ({"text": "Shared.", "items": [{"custom_id": "a"}]}, "text"),
    ({"colour": "blue", "items": [{"text": "Fine."}]}, "colour"),
    ({"items": [{"text": "Fine.", "colour": "blue"}]}, "items[0].colour"),
    ({"items": [{"text": "Fine.", "priority": "urgent"}]}, "items[0].priority"),
    ({"items": [{"text": "Fine.", "custom_id": "../etc/passwd"}]}, "items[0].custom_id"),
    ({"items": [{"text": "Fine.", "custom_id": "a"}, {"text": "Fine.", "custom_id": "a"}]}, "items[1].custom_id"),
    ({"items": [{"text": "Fine.", "custom_id": 7}]}, "items[0].custom_id"),
    ({"items": [{"text": "Fine.", "voice": True}]}, "items[0].voice"),
    ({"callback_url": "http://example.com/done", "items": [{"text": "Fine."}]}, "callback_url"),
    ([{"text": "Fine."}], "body"),
]


@pytest.mark.parametrize(("body", "field"), BAD_BATCHES, ids=[field for _, field in BAD_BATCHES])
def test_one_bad_item_refuses_the_whole_batch_naming_it_and_nothing_is_left_behind(
    tiny_settings, tmp_path, idle_redis_url, body, field
):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url)

    answer = app.test_client().post("/api/batches", json=body)

    assert answer.status_code == 400 and answer.get_json()["field"] == field, answer.get_json()
    assert answer.get_json()["error"].startswith(field) or field in ("items", "body", "text")
    assert rows(app, Job) == 0 and rows(app, Batch) == 0 and waiting(app) == 0


def test_an_item_naming_a_voice_nobody_has_is_a_422_naming_it(tiny_settings, tmp_path, idle_redis_url):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url)

    answer = app.test_client().post(
        "/api/batches", json={"items": [{"text": "Fine.", "voice": "alloy"}, {"text": "Fine.", "voice": "Nobody"}]}
    )

    assert answer.status_code == 422 and answer.get_json()["field"] == "items[1].voice"
    assert rows(app, Job) == 0 and waiting(app) == 0


@pytest.mark.parametrize(
    ("upload", "defaults", "field"),
    [
        (jsonl({"text": "Fine."}) + b"{not json\n", None, "items[1]"),
        (jsonl({"text": "Fine."}, {"text": ""}), None, "items[1].text"),
        (b"\xff\xfe", None, "items"),
        (jsonl({"text": "Fine."}), "[1, 2]", "defaults"),
        (jsonl({"text": "Fine."}), "{broken", "defaults"),
        (jsonl({"text": "Fine."}), json.dumps({"items": []}), "defaults"),
        (jsonl({"text": "Fine."}), json.dumps({"format": "bmp"}), "format"),
        (None, "{}", "items"),
    ],
)
def test_a_bad_upload_is_refused_whole_naming_the_line_or_field_at_fault(
    tiny_settings, tmp_path, idle_redis_url, upload, defaults, field
):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url)
    form = {"defaults": defaults} if defaults is not None else {}
    if upload is not None:
        form["items"] = (io.BytesIO(upload), "items.jsonl")

    answer = app.test_client().post(
        "/api/batches", data=form, headers=UPLOAD_HEADERS, content_type="multipart/form-data"
    )

    assert answer.status_code == 400 and answer.get_json()["field"] == field, answer.get_json()
    assert rows(app, Job) == 0 and rows(app, Batch) == 0 and waiting(app) == 0


def test_an_upload_without_the_csrf_header_is_refused_with_keys_off(tiny_settings, tmp_path, idle_redis_url):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url)

    answer = app.test_client().post("/api/batches", data={"items": (io.BytesIO(jsonl({"text": "Hi."})), "a.jsonl")})

    assert answer.status_code == 403 and rows(app, Job) == 0


def test_a_batch_body_may_pass_the_request_limit_up_to_the_batch_limit(tiny_settings, tmp_path, idle_redis_url):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url, max_request_bytes=4096, max_batch_bytes=64 * 1024)
    client = app.test_client()
    items = [{"text": f"Item {number} of a batch larger than one request."} for number in range(200)]

    fits = client.post("/api/batches", json={"items": items[:100]})  # ~6 KB
    too_big = client.post("/api/batches", json={"items": items * 10})  # ~120 KB

    assert fits.status_code == 202 and fits.get_json()["size"] == 100
    assert too_big.status_code == 413 and too_big.get_json()["field"] == "body"
    assert client.post("/api/jobs", json={"text": "x" * 5000}).status_code == 413  # a job's limit stands


def test_a_batch_past_its_keys_cap_on_waiting_jobs_is_refused_whole(tiny_settings, tmp_path, idle_redis_url):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url, require_api_key=True, max_queued_jobs_per_key=4)
    client, key = app.test_client(), make_key(app, "batcher")

    refused = client.post("/api/batches", json={"items": [{"text": "One of five."}] * 5}, headers=bearer(key))
    four = client.post("/api/batches", json={"items": [{"text": "One of four."}] * 4}, headers=bearer(key))

    assert refused.status_code == 429 and refused.headers["Retry-After"]
    assert "these 5 jobs" in refused.get_json()["error"]
    assert four.status_code == 202
    assert {item["job_id"] for item in four.get_json()["items"]} == reserved_jobs(app, key)
    assert rows(app, Batch) == 1 and rows(app, Job) == 4 and waiting(app) == 4


def test_a_batch_past_the_farms_cap_is_refused_whole(tiny_settings, tmp_path, idle_redis_url):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url, max_queued_jobs=3)

    refused = app.test_client().post("/api/batches", json={"items": [{"text": "Too many."}] * 4})

    assert refused.status_code == 503 and refused.headers["Retry-After"]
    assert rows(app, Job) == 0 and rows(app, Batch) == 0 and waiting(app) == 0


def test_a_batch_past_its_keys_audio_quota_is_refused_whole_and_holds_none_of_it(
    tiny_settings, tmp_path, idle_redis_url
):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url, require_api_key=True, daily_audio_quota_s=10)
    client, key = app.test_client(), make_key(app, "talker")

    refused = client.post("/api/batches", json={"items": [{"text": LONG_TEXT}] * 3}, headers=bearer(key))

    assert refused.status_code == 429 and "quota" in refused.get_json()["error"]
    assert reserved_jobs(app, key) == set() and waiting(app) == 0 and rows(app, Job) == 0
    assert client.post("/api/batches", json={"items": [{"text": "Short."}]}, headers=bearer(key)).status_code == 202


def test_the_rate_limit_counts_a_batchs_items(tiny_settings, tmp_path, idle_redis_url):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url, require_api_key=True)
    app.config["SETTINGS"] = dataclasses.replace(app.config["SETTINGS"], rate_limit_per_minute=4)
    client, key = app.test_client(), make_key(app, "eager")
    well_inside_a_minute()

    refused = client.post("/api/batches", json={"items": [{"text": "Hi."}] * 5}, headers=bearer(key))

    assert refused.status_code == 429 and "a minute" in refused.get_json()["error"]
    assert rows(app, Job) == 0 and reserved_jobs(app, key) == set()


def test_a_batch_is_its_keys_own(tiny_settings, tmp_path, idle_redis_url):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url, require_api_key=True)
    client, ann, bob = app.test_client(), make_key(app, "ann"), make_key(app, "bob")
    created = client.post("/api/batches", json={"items": [{"text": "Mine."}]}, headers=bearer(ann)).get_json()

    for method, path in [("get", ""), ("get", "/archive"), ("delete", "")]:
        answer = getattr(client, method)(created["status_url"] + path, headers=bearer(bob))
        assert answer.status_code == 404, (method, path)
    assert client.get(created["status_url"], headers=bearer(ann)).get_json()["status"] == "running"
    assert client.get("/api/batches/not-a-batch", headers=bearer(ann)).status_code == 404


def test_ten_thousand_items_are_submitted_in_seconds_sent_in_order_and_cancelled_together(
    tiny_settings, tmp_path, idle_redis_url
):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url)
    client = app.test_client()
    items = [
        {"text": f"Item number {number} of the largest batch.", "custom_id": f"n{number}"}
        for number in range(MAX_ITEMS)
    ]

    started = time.monotonic()
    answer = client.post("/api/batches", json={"items": items, "format": "mp3"})
    submit_s = time.monotonic() - started

    assert answer.status_code == 202, answer.get_json()
    created = answer.get_json()
    print(f"\n{MAX_ITEMS} items submitted in {submit_s:.1f} s")
    assert submit_s < 60  # ~6 s on the 2-core development machine; round trips per item would be minutes
    assert created["counts"]["queued"] == MAX_ITEMS and [item["custom_id"] for item in created["items"][:2]] == [
        "n0",
        "n1",
    ]
    sent = queued_messages(app, PRIORITY_QUEUES["bulk"])
    assert sent[::-1] == [item["job_id"] for item in created["items"]]  # the newest at the head

    # Watched without its items, a large batch costs a fraction of its whole description.
    started = time.monotonic()
    whole = client.get(created["status_url"])
    whole_s = time.monotonic() - started
    started = time.monotonic()
    counted = client.get(created["status_url"] + "?items=none")
    print(
        f"its status read in {whole_s:.2f} s ({len(whole.data):,} bytes), without items in "
        f"{time.monotonic() - started:.2f} s ({len(counted.data):,} bytes)"
    )
    assert "items" not in counted.get_json() and len(whole.get_json()["items"]) == MAX_ITEMS
    assert counted.get_json()["counts"] == whole.get_json()["counts"] and len(counted.data) < 2_000

    started = time.monotonic()
    cancelled = client.delete(created["status_url"]).get_json()
    print(f"{MAX_ITEMS} items cancelled in {time.monotonic() - started:.1f} s")

    assert cancelled["status"] == "cancelled" and cancelled["counts"]["cancelled"] == MAX_ITEMS
    assert waiting(app) == 0  # every message taken out of the queue


def test_a_batchs_status_lists_its_items_unless_asked_not_to(tiny_settings, tmp_path, idle_redis_url):
    client = capped_app(tiny_settings, tmp_path, idle_redis_url).test_client()
    created = client.post("/api/batches", json={"items": [{"text": "One."}, {"text": "Two."}]}).get_json()

    assert len(client.get(created["status_url"]).get_json()["items"]) == 2
    counted = client.get(created["status_url"] + "?items=none").get_json()
    assert "items" not in counted and counted["size"] == 2 and counted["counts"]["queued"] == 2
    refused = client.get(created["status_url"] + "?items=some")
    assert refused.status_code == 400 and refused.get_json()["field"] == "items"


def test_gc_deletes_a_batch_that_ended_past_the_retention_with_its_items_and_keeps_a_younger_one(
    tiny_settings, tmp_path, idle_redis_url
):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url)
    client = app.test_client()
    old, young = (client.post("/api/batches", json={"items": [{"text": "Short lived."}] * 2}).get_json() for _ in "ab")
    for batch in (old, young):
        assert client.delete(batch["status_url"]).get_json()["status"] == "cancelled"
    long_ago = utcnow() - timedelta(seconds=tiny_settings.job_retention_s + 60)
    with app.app_context():
        db.session.execute(db.update(Job).where(Job.batch_id == old["id"]).values(finished_at=long_ago))
        db.session.execute(db.update(Batch).where(Batch.id == old["id"]).values(finished_at=long_ago))
        db.session.commit()
        collected = retention.collect()

    assert (collected.jobs, collected.batches) == (2, 1)
    assert client.get(old["status_url"]).status_code == 404
    assert client.get(young["status_url"]).get_json()["counts"]["cancelled"] == 2


def test_a_queue_lost_while_a_batch_is_sent_is_a_503_and_every_item_is_recorded_failed(
    tiny_settings, tmp_path, idle_redis_url
):
    app = capped_app(tiny_settings, tmp_path, idle_redis_url)
    app.extensions["backends"].sender.conf.broker_url = "redis://127.0.0.1:1/0"  # the broker goes away

    answer = app.test_client().post("/api/batches", json={"items": [{"text": "Lost."}] * 3})

    assert answer.status_code == 503 and "could not be reached" in answer.get_json()["error"]
    with app.app_context():
        items = db.session.execute(db.select(Job)).scalars().all()
        assert [item.status for item in items] == ["failed"] * 3 and "could not be reached" in items[0].error
        assert db.session.execute(db.select(Batch)).scalar_one().finished_at is not None  # it has ended
    assert waiting(app) == 0  # no admission left behind
