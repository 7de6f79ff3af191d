"""Batches: up to 10,000 jobs submitted in one request (``POST /api/batches``), all or none.

Every item is validated before any job exists: one bad item refuses the whole batch with a 400 naming it
(``items[5].text``), and the caps on jobs waiting, the key's rate limit and its audio quota take the batch
as a whole (:func:`web.jobs.submit_together`, as the voice workshop's jobs are). Its items are jobs like any
other, bulk unless they say otherwise, each knowing its batch, its place in it and its ``custom_id``.

A batch ends when its last item has ended (done, failed or cancelled): the request that ends that item
notices it (:func:`web.batch_status.notice_end`), once, and hands the batch's callback, if it has one, to the delivery
queue as a job's is (web.callbacks). The reconciler looks at the unfinished items of batches with a
callback, which nobody may be polling.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
import zipfile
from collections.abc import Iterator
from typing import Any

from flask import current_app
from sqlalchemy import inspect as sa_inspect
from werkzeug.datastructures import FileStorage

from chattts_farm.audio_store import AudioStore
from chattts_farm.callbacks import CallbackPolicy, CallbackRefused
from chattts_farm.contract import InvalidRequest, SynthesisRequest
from web import access, backends, batch_status, callbacks, jobs, voices
from web.errors import ApiError
from web.json_body import json_value
from web.models import CUSTOM_ID_MAX_CHARS, Batch, Job, JobStatus, Voice, db, utcnow

logger = logging.getLogger(__name__)

MAX_ITEMS = 10_000
# What a batch itself takes; every other field is a job's, the default of each item that does not give it.
BATCH_FIELDS = ("items", "callback_url")
# A job's two ways of naming its voice.
VOICE_FIELDS = {"voice", "voice_id"}
# What the defaults are checked with, alone: the text is always an item's own.
PLACEHOLDER_TEXT = "The defaults of a batch."
# Items are bulk work unless they say otherwise: interactive and normal jobs pass ahead of them.
DEFAULT_PRIORITY = "bulk"
CUSTOM_ID = re.compile(rf"[A-Za-z0-9_-][A-Za-z0-9._-]{{0,{CUSTOM_ID_MAX_CHARS - 1}}}")


def create(fields: dict[str, Any]) -> Batch:
    """A batch from a JSON body: ``items`` (a list of jobs' fields, each with an optional ``custom_id``),
    ``callback_url`` (the batch's), and any job field but ``text`` as every item's default."""
    items = fields.get("items")
    if not isinstance(items, list):
        raise ApiError(400, f"items must be a list of 1 to {MAX_ITEMS} jobs' fields", "items")
    return _submit(items, fields)


def create_from_upload(upload: FileStorage | None, defaults: str | None) -> Batch:
    """A batch from an upload: the file ``items``, one item a line (JSON Lines; blank lines are skipped),
    and ``defaults``, a JSON object of what a JSON body takes beside ``items``."""
    if upload is None:
        raise ApiError(400, "upload the items as the file items: one job's fields a line (JSON Lines)", "items")
    fields = json_value(defaults, "defaults") if defaults else {}
    if not isinstance(fields, dict) or "items" in fields:
        raise ApiError(400, "defaults must be a JSON object of the batch's fields but items", "defaults")
    try:
        lines = [line for line in upload.stream.read().decode().splitlines() if line.strip()]
    except UnicodeDecodeError:
        raise ApiError(400, "items must be UTF-8 text: one job's fields a line (JSON Lines)", "items") from None
    if len(lines) > MAX_ITEMS:  # before reading them: a batch too large is refused whatever its items
        _refuse_size(len(lines))
    return _submit([json_value(line, f"items[{number}]") for number, line in enumerate(lines)], fields)


def _submit(items: list, fields: dict[str, Any]) -> Batch:
    if not 1 <= len(items) <= MAX_ITEMS:
        _refuse_size(len(items))
    if "text" in fields:
        raise ApiError(400, "text is each item's own: give it in every item, not as a default", "text")
    settings = current_app.config["SETTINGS"]
    policy = CallbackPolicy.from_settings(settings)
    batch_callback = _callback_url(fields.get("callback_url"), policy)
    defaults = {"priority": DEFAULT_PRIORITY, **{k: v for k, v in fields.items() if k not in BATCH_FIELDS}}
    # Thousands of items often speak in one voice: each is read (a catalog voice looked up) once.
    voices_read: dict[str, Any] = {}

    def request_of(arguments: dict[str, Any]) -> tuple[SynthesisRequest, Voice | None]:
        return voices.job_request(
            arguments, max_text_chars=settings.max_text_chars, callbacks=policy, voices_read=voices_read
        )

    # The defaults are checked as they are, even where every item gives its own values instead.
    request_of({**defaults, "text": PLACEHOLDER_TEXT})
    requests: list[tuple[SynthesisRequest, Voice | None]] = []
    custom_ids: list[str | None] = []
    places: dict[str, int] = {}  # each custom_id's item
    for number, item in enumerate(items):
        if not isinstance(item, dict):
            raise ApiError(400, f"items[{number}] must be a JSON object: a job's fields", f"items[{number}]")
        custom_ids.append(_custom_id(item, number, places))
        # An item's voice, named either way, replaces the default's, named either way.
        replaced = VOICE_FIELDS if VOICE_FIELDS & set(item) else set()
        arguments = {
            **{k: v for k, v in defaults.items() if k not in replaced},
            **{k: v for k, v in item.items() if k != "custom_id"},
        }
        try:
            requests.append(request_of(arguments))
        except (InvalidRequest, ApiError) as refusal:
            raise _naming_the_item(refusal, number) from None
    key = access.current_key()
    batch = Batch(
        id=str(uuid.uuid4()), size=len(items), api_key_id=key.id if key else None, callback_url=batch_callback
    )
    jobs.submit_together(requests, in_batch=batch, custom_ids=custom_ids)
    logger.info("batch %s of %d items queued", batch.id, len(items))
    return batch


def _refuse_size(count: int) -> None:
    raise ApiError(400, f"a batch has 1 to {MAX_ITEMS} items, not {count}", "items")


def _callback_url(url: Any, policy: CallbackPolicy) -> str | None:
    """The batch's own callback, checked as a job's is (the same rules on where the farm may call)."""
    if url is None:
        return None
    try:
        return policy.check(url)
    except CallbackRefused as refusal:
        raise ApiError(400, f"callback_url: {refusal}", "callback_url") from None


def _naming_the_item(refusal: InvalidRequest | ApiError, number: int) -> ApiError:
    """An item's refusal, naming the field as the batch holds it: ``items[5].text``."""
    status = refusal.status if isinstance(refusal, ApiError) else 400
    field = f"items[{number}]" if refusal.field is None else f"items[{number}].{refusal.field}"
    # A message may begin with its field's name already (a voice's refusal does).
    message = refusal.message.removeprefix(f"{refusal.field}: ") if refusal.field is not None else refusal.message
    return ApiError(status, f"{field}: {message}", field)


def _custom_id(item: dict, number: int, places: dict[str, int]) -> str | None:
    """The item's custom_id, if it has one; ``places`` keeps each one's item, so none is given twice."""
    custom_id = item.get("custom_id")
    if custom_id is None:
        return None
    field = f"items[{number}].custom_id"
    if not isinstance(custom_id, str) or not CUSTOM_ID.fullmatch(custom_id):
        raise ApiError(
            400,
            f"{field} must be 1 to {CUSTOM_ID_MAX_CHARS} letters, digits, '_', '-' and '.' (not first): it names"
            " the item's audio in the batch's archive",
            field,
        )
    if custom_id in places:
        raise ApiError(400, f"{field}: {custom_id!r} is items[{places[custom_id]}]'s already", field)
    places[custom_id] = number
    return custom_id


def visible(batch_id: str) -> Batch:
    """The batch as the caller may see it; 404 otherwise."""
    batch = visible_or_none(batch_id)
    if batch is None:  # also when it is another key's batch: the same answer, so ids cannot be probed
        raise ApiError(404, f"no batch {batch_id}")
    return batch


def visible_or_none(batch_id: str) -> Batch | None:
    """A batch by id as the caller may see it: with keys on, only the key that submitted it does."""
    batch = db.session.get(Batch, batch_id) if _is_batch_id(batch_id) else None
    key = access.current_key()
    return batch if batch is not None and (key is None or batch.api_key_id == key.id) else None


def recent(limit: int) -> list[Batch]:
    """The caller's newest batches (all batches with keys off), newest first, as their rows hold them."""
    query = db.select(Batch).order_by(Batch.created_at.desc()).limit(limit)
    key = access.current_key()
    if key is not None:
        query = query.where(Batch.api_key_id == key.id)
    return list(db.session.execute(query).scalars())


def items(batch: Batch) -> list[Job]:
    """The batch's items in their order, brought up to date (their tasks' states read in bulk)."""
    stored = batch_status.stored_items(batch)
    jobs.refresh_all(stored)
    if batch.finished_at is None:
        batch_status.notice_end(batch.id)
    else:
        callbacks.settle(batch)
    # Read again in one query when a commit above (an item's end, the batch's) expired every row; not
    # when none did (the rows of 10,000 items, loaded, are most of a poll's time).
    if any(sa_inspect(job).expired for job in stored):
        return batch_status.stored_items(batch)
    return stored


def cancel(batch: Batch) -> list[Job]:
    """Cancel every unfinished item (as a DELETE of each would); the batch ends cancelled, unless it had
    ended already. Its items, brought up to date."""
    db.session.execute(
        db.update(Batch)
        .where(Batch.id == batch.id, Batch.finished_at.is_(None), Batch.cancelled_at.is_(None))
        .values(cancelled_at=utcnow()),
        execution_options={"synchronize_session": False},
    )
    db.session.commit()
    jobs.cancel_all(items(batch))
    batch_status.notice_end(batch.id)
    return batch_status.stored_items(batch)


def watch_for_callbacks() -> None:
    """Notice the end of every unfinished batch with a callback (nobody may be polling it), queue the
    callbacks still pending of ended batches (their queue could not be reached as they ended), and keep
    in their rows the outcomes of those the workers have delivered or given up on."""
    unfinished = db.select(Batch).where(Batch.callback_url.is_not(None), Batch.finished_at.is_(None))
    for batch in db.session.execute(unfinished).scalars().all():
        items(batch)
    for batch in callbacks.pending(Batch):
        batch_status.call_back(batch)
    callbacks.settle_queued(Batch)


def archive(batch: Batch, batch_items: list[Job]) -> Iterator[bytes]:
    """A zip of every done item's audio, named by its ``custom_id`` or its place (``0042.mp3``), and
    ``manifest.json``: each item's place, custom_id, job id, status, duration, error and file (null when
    it has none: not done, or its audio expired). Written as it is sent, an item's audio a piece at a time
    from the audio store: never the whole archive, nor a whole file, in memory. Stored, not deflated:
    the audio is compressed already, or WAV, which deflate barely shrinks.

    Everything it needs is read here: the body is sent after the request, its database session, has gone."""
    width = len(str(batch.size - 1))
    names: set[str] = set()
    entries = []
    for job in batch_items:
        name = job.custom_id or f"{job.batch_item:0{width}d}"
        # A custom_id may be another item's place ("7"): the second of the two takes its own place too.
        # "~" is in no custom_id and no place, so the name is taken by nobody else.
        name = f"{name}~{job.batch_item}" if name in names else name
        names.add(name)
        described = {
            "item": job.batch_item,
            "custom_id": job.custom_id,
            "job_id": job.id,
            "status": job.status,
            "duration_s": job.duration_s,
            "error": job.error,
            "file": f"{name}.{job.format}",
        }
        entries.append((described, job.audio_key if job.status == JobStatus.DONE else None))
    return _zipped(batch.id, entries, backends.current().audio)


def _zipped(batch_id: str, entries: list[tuple[dict, str | None]], store: AudioStore) -> Iterator[bytes]:
    sink = _Sink()
    manifest = []
    with zipfile.ZipFile(sink, "w", zipfile.ZIP_STORED) as archive_file:
        for described, audio_key in entries:
            stored = store.open(audio_key) if audio_key is not None else None
            if stored is None:
                expired = {"error": "its audio has expired"} if audio_key is not None else {}
                manifest.append({**described, **expired, "file": None})
                continue
            with stored, archive_file.open(described["file"], "w") as entry:
                for chunk in stored.chunks():
                    entry.write(chunk)
                    yield sink.take()
            manifest.append(described)
        archive_file.writestr("manifest.json", json.dumps({"batch_id": batch_id, "items": manifest}, indent=2))
    yield sink.take()


class _Sink:
    """Where the zip writer writes: what it has written since last taken. Not seekable, so the writer
    puts each entry's sizes after its data, as a stream needs."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.offset = 0

    def write(self, data: bytes) -> int:
        self.written += data
        self.offset += len(data)
        return len(data)

    def tell(self) -> int:
        return self.offset

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        taken, self.written = bytes(self.written), bytearray()
        return taken


def _is_batch_id(text: str) -> bool:
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False
