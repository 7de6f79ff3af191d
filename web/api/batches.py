"""The batch endpoints: submit up to 10,000 jobs at once, read how they go, download their audio as one
zip, cancel them."""

from __future__ import annotations

from flask import Response, request

from web import MULTIPART, access, batch_status, batches, sent_as_form, takes_uploads_up_to
from web.api import bp
from web.errors import ApiError
from web.json_body import json_object
from web.waiting import WaitSlot

TOO_BIG = "the batch is larger than CHATTTS_FARM_MAX_BATCH_BYTES: split it into smaller batches"


@bp.post("/batches")
@takes_uploads_up_to(lambda settings: settings.max_batch_bytes, "body", TOO_BIG, (MULTIPART, "application/json"))
def create_batch():
    """A batch from JSON (``items``, shared defaults, ``callback_url``), or a multipart upload: the JSON
    Lines file ``items`` and the field ``defaults``, a JSON object of the rest."""
    if sent_as_form():
        access.refuse_cross_site_forms()
        batch = batches.create_from_upload(request.files.get("items"), request.form.get("defaults"))
    else:
        batch = batches.create(json_object())
    body = batch_status.describe(batch, batches.items(batch))
    return body, 202, {"Location": body["status_url"]}


@bp.get("/batches/<batch_id>")
def get_batch(batch_id: str):
    """``?items=none``: the counts and progress alone, for a watcher of a large batch (10,000 items'
    descriptions are ~2.8 MB, read every few seconds)."""
    listed = request.args.get("items", "all")
    if listed not in ("all", "none"):
        raise ApiError(400, "items must be all or none", "items")
    batch = batches.visible(batch_id)
    return batch_status.describe(batch, batches.items(batch), listed=listed == "all")


@bp.get("/batches/<batch_id>/archive")
def batch_archive(batch_id: str):
    """Every done item's audio in one zip, with manifest.json; streamed as it is written."""
    batch = batches.visible(batch_id)
    zipped = batches.archive(batch, batches.items(batch))
    # A download held open as long as it takes: it counts against its key's bound, as a job's audio does.
    slot = WaitSlot.take()
    return Response(
        slot.held_while(zipped),
        mimetype="application/zip",
        headers={"Content-Disposition": f'attachment; filename="chattts-batch-{batch.id}.zip"'},
    )


@bp.delete("/batches/<batch_id>")
def cancel_batch(batch_id: str):
    batch = batches.visible(batch_id)
    return batch_status.describe(batch, batches.cancel(batch))
