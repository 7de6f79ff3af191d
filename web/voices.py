"""The voice catalog: create, find by tags and text, edit, export and import.

The catalog is shared: every key finds, reads and speaks every voice. A voice belongs to the key that
made it (by create, import or from a job), and only that key or an admin key may change or delete it.
With keys off there are no keys, and anyone may. Names, tags and descriptions follow the policy of job
texts: control and invisible characters are dropped (:func:`chattts_farm.text.drop_invisible`).
"""

from __future__ import annotations

import secrets
from typing import Any

from sqlalchemy import or_

from chattts_farm.contract import (
    EMBEDDING_TASK_NAME,
    MAX_SEED,
    OPENAI_VOICE_SEEDS,
    Blend,
    InvalidRequest,
    SynthesisRequest,
    as_integer,
    looks_like_embedding,
    mix_parts,
    parse_voice,
    voice_argument,
)
from chattts_farm.text import drop_invisible
from web import access, backends
from web.errors import ApiError
from web.models import Job, JobStatus, Tag, Voice, db, voice_tags

EMBEDDING_TIMEOUT_S = 60
# Voice ids are PostgreSQL's 32-bit integers (SQLite's, counted up from 1, never get near): a larger
# number names no voice, and is not looked up (PostgreSQL would refuse it rather than find nothing).
MAX_ID = 2**31 - 1
PREVIEW_TEXT = "Hello! This is how I sound. [laugh] Nice to meet you."
# The voice workshop speaks one sentence in new random voices, all in one request (and one GPU batch).
WORKSHOP_TEXT = "Hello there. This is one of the new voices you could keep in your catalog."
WORKSHOP_VOICES_DEFAULT = 6
WORKSHOP_VOICES_MAX = 16
MAX_NAME_CHARS = 100
MAX_TAG_CHARS = 64
_TEXT_FIELDS = {"description": 2000, "gender": 20, "age": 20}
# The search text is matched literally: LIKE's wildcards and its escape character are escaped.
_LIKE_ESCAPE = "\\"
_LIKE_SPECIAL = str.maketrans({"%": "\\%", "_": "\\_", "\\": "\\\\"})


def find(tags: list[str], query: str | None) -> list[Voice]:
    """Voices carrying every tag given and whose name or description contains the query text."""
    select = db.select(Voice).order_by(Voice.favourite.desc(), Voice.rating.desc(), Voice.name)
    for tag in normalise_tags(tags):
        select = select.where(Voice.tags.any(Tag.name == tag))
    query = drop_invisible(query or "").strip()
    if query:
        pattern = f"%{query.translate(_LIKE_SPECIAL)}%"
        select = select.where(
            or_(Voice.name.ilike(pattern, escape=_LIKE_ESCAPE), Voice.description.ilike(pattern, escape=_LIKE_ESCAPE))
        )
    return list(db.session.execute(select).scalars())


def tags_in_use() -> list[str]:
    """Every tag some voice carries, alphabetically: the catalog page's filter chips."""
    in_use = db.select(Tag.name).join(voice_tags, voice_tags.c.tag_id == Tag.id).distinct().order_by(Tag.name)
    return list(db.session.execute(in_use).scalars())


def named(name: str) -> Voice | None:
    """The catalog voice with this name (surrounding spaces, control and invisible characters ignored, as
    names are stored without them), if any."""
    return db.session.execute(db.select(Voice).where(Voice.name == drop_invisible(name).strip())).scalar_one_or_none()


def by_id(voice_id: int) -> Voice | None:
    return db.session.get(Voice, voice_id) if 0 < voice_id <= MAX_ID else None


def get(voice_id: int) -> Voice:
    voice = by_id(voice_id)
    if voice is None:
        raise ApiError(404, f"no voice {voice_id}")
    return voice


def get_to_change(voice_id: int) -> Voice:
    """The voice, when the caller may change or delete it; 403 naming it when another key owns it."""
    voice = get(voice_id)
    if voice.may_be_changed_by(access.current_key()):
        return voice
    if voice.owner_key_id is None:
        why = "has no owner (it was made with keys off or before voices had owners): only an admin key"
    else:
        why = "belongs to another key: only its owner or an admin key"
    raise ApiError(403, f"voice {voice.id} ({voice.name!r}) {why} may change or delete it", "voice_id")


def resolve(value: Any, field: str = "voice") -> Voice | int | str | Blend | None:
    """A job's voice: a seed, an OpenAI voice name's seed, an embedding string or a blend (whose parts may
    be any of these and catalog voices, :func:`blend`), else the catalog voice the text names (None when it
    names none). A catalog voice named like an OpenAI voice is spoken instead of its seed: that is how an
    admin gives the name another voice (see :func:`_name`). :class:`InvalidRequest` naming ``field`` for a
    value that is neither a seed, an embedding, a blend nor a name."""
    if isinstance(value, dict):
        return blend(value, field)
    if isinstance(value, str) and value.strip() in OPENAI_VOICE_SEEDS:
        return named(value) or OPENAI_VOICE_SEEDS[value.strip()]
    try:
        return parse_voice(value, field)
    except InvalidRequest:
        # Text written as an embedding is one (too long, say), not a name: it keeps the contract's refusal.
        if not isinstance(value, str) or not value.strip() or looks_like_embedding(value):
            raise
    return named(value)


def blend(value: dict, field: str = "voice") -> Blend:
    """A blend whose parts name voices as jobs do, catalog voices among them (each mixed as its embedding);
    a 422 naming ``field`` for a part naming no voice, :class:`InvalidRequest` for any other fault."""
    parts = [
        {**part, "voice": argument(to_speak(part["voice"], field))} if isinstance(part["voice"], str) else part
        for part in mix_parts(value, field)
    ]
    return parse_voice({"mix": parts}, field)


def to_speak(value: Any, field: str = "voice") -> Voice | int | str | Blend:
    """A voice a job may speak in (as :func:`resolve` reads it); a 422 naming ``field`` for a name that is
    neither an OpenAI voice name nor a catalog voice's (:class:`InvalidRequest`, a 400, for a value that
    is no voice at all)."""
    return all_to_speak([value], field)[0]


def all_to_speak(values: list[Any], field: str) -> list[Voice | int | str | Blend]:
    """Voices as :func:`to_speak` reads each, every value's form checked (a 400) before an unknown name is
    refused (a 422): a list with a name unknown and a value no voice at all is malformed first."""
    voices = [resolve(value, field) for value in values]
    for value, voice in zip(values, voices, strict=True):
        if voice is None:
            # A 422: the request is well formed, the name unknown.
            raise ApiError(
                422,
                f"{field}: {value.strip()!r} is neither an OpenAI voice name ({', '.join(OPENAI_VOICE_SEEDS)}),"
                " a catalog voice's name, a seed nor an embedding",
                field,
            )
    return voices


def argument(voice: Voice | int | str | Blend) -> int | str | dict:
    """What a job's ``voice`` argument holds for a voice: a catalog voice's embedding, else the seed,
    embedding or blend itself."""
    return voice.spk_emb if isinstance(voice, Voice) else voice_argument(voice)


def create(fields: dict[str, Any]) -> Voice:
    """A new voice from a name and a seed, an embedding or a blend (``mix``, the parts of a blend as jobs
    take it); the embedding is always stored, a blend's mixed by a worker as jobs speak it."""
    name = _name(fields.get("name"))
    given = sorted({"seed", "spk_emb", "mix"} & set(fields))
    if len(given) != 1:
        raise ApiError(400, "give exactly one of seed, spk_emb or mix", given[1] if given else "seed")
    seed = _seed(fields["seed"]) if "seed" in fields else None
    mixed = blend({"mix": fields["mix"]}, "mix") if "mix" in fields else None
    voice = Voice(
        name=name,
        seed=seed,
        spk_emb=_embedding(fields["spk_emb"]) if "spk_emb" in fields else None,
        owner_key_id=_caller_key_id(),
    )
    update(voice, {k: v for k, v in fields.items() if k not in ("name", "seed", "spk_emb", "mix")}, commit=False)
    # Only once every field is valid: a worker may take up to a minute to answer.
    if voice.spk_emb is None:
        voice.spk_emb = embedding_from_worker(seed if seed is not None else mixed, given[0])
    db.session.add(voice)
    _commit_unique(name)
    return voice


def update(voice: Voice, fields: dict[str, Any], *, commit: bool = True) -> Voice:
    editable = {"name", "tags", "rating", "favourite", *_TEXT_FIELDS}
    unknown = sorted(set(fields) - editable)
    if unknown:
        raise ApiError(400, f"{unknown[0]} cannot be set; editable: {', '.join(sorted(editable))}", unknown[0])
    # No autoflush while fields change: a name already taken must fail at the commit (a 409), not in a
    # query on the way (looking tags up, loading the old ones).
    with db.session.no_autoflush:
        if "name" in fields:
            voice.name = _name(fields["name"])
        if "tags" in fields:
            voice.tags = _tags(fields["tags"])
        if "rating" in fields:
            rating = as_integer(fields["rating"])
            if rating is None or not 0 <= rating <= 5:
                raise ApiError(400, "rating must be an integer from 0 to 5", "rating")
            voice.rating = rating
        if "favourite" in fields:
            if not isinstance(fields["favourite"], bool):
                raise ApiError(400, "favourite must be true or false", "favourite")
            voice.favourite = fields["favourite"]
        for field, limit in _TEXT_FIELDS.items():
            if field in fields:
                value = _optional_text(fields[field], field, limit)
                setattr(voice, field, value if field != "description" else (value or ""))
    if commit:
        _commit_unique(voice.name)
    return voice


def preview(voice: Voice, max_text_chars: int) -> Job:
    """The caller's preview of a voice: generated once per key (once in all with keys off) and kept;
    again only when it failed or its audio expired. No key is ever given another key's preview job."""
    from web import jobs

    key_id = _caller_key_id()
    kept = db.session.execute(
        db.select(Job)
        .where(Job.is_preview, Job.voice_id == voice.id, Job.api_key_id == key_id)
        .order_by(Job.created_at.desc())
        .limit(1)
    ).scalar_one_or_none()
    if kept is not None:
        jobs.refresh(kept)
        usable = kept.status in (JobStatus.QUEUED, JobStatus.RUNNING) or (
            kept.status == JobStatus.DONE and backends.current().audio.size(kept.audio_key) is not None
        )
        if usable:
            return kept
    job = jobs.submit(
        SynthesisRequest.from_arguments({"text": PREVIEW_TEXT, "voice": voice.spk_emb}, max_text_chars=max_text_chars),
        voice,
    )
    job.is_preview = True
    db.session.commit()
    return job


def workshop(fields: dict[str, Any], max_text_chars: int) -> list[Job]:
    """One sentence (``text``) in the ``voices`` named (any voice a job takes: OpenAI names, catalog names,
    seeds, embeddings; none by default), then in ``count`` new voices, each of a fresh random seed (6 by
    default, none when voices are named), submitted together in that order: all or none pass the queue's
    caps and the key's quota, and a worker runs them in one batch."""
    from web import jobs

    unknown = sorted(set(fields) - {"text", "voices", "count"})
    if unknown:
        raise ApiError(400, f"the workshop takes text, voices and count only, not {unknown[0]}", unknown[0])
    named_voices = fields.get("voices", [])
    if not isinstance(named_voices, list) or len(named_voices) > WORKSHOP_VOICES_MAX:
        raise ApiError(400, f"voices must be a list of at most {WORKSHOP_VOICES_MAX} voices", "voices")
    chosen = all_to_speak(named_voices, "voices")
    count = as_integer(fields.get("count", 0 if chosen else WORKSHOP_VOICES_DEFAULT))
    if "count" in fields and (count is None or not 1 <= count <= WORKSHOP_VOICES_MAX):
        raise ApiError(400, f"count must be a whole number of voices from 1 to {WORKSHOP_VOICES_MAX}", "count")
    seeds: set[int] = set()
    while len(seeds) < count:
        seeds.add(secrets.randbelow(MAX_SEED + 1))
    text = fields.get("text", WORKSHOP_TEXT)
    requests = [
        (
            SynthesisRequest.from_arguments(
                {"text": text, "voice": argument(voice)},
                max_text_chars=max_text_chars,
            ),
            voice if isinstance(voice, Voice) else None,
        )
        for voice in [*chosen, *sorted(seeds)]
    ]
    return jobs.submit_together(requests)


def delete(voice: Voice) -> None:
    db.session.delete(voice)
    db.session.commit()


def from_job(job: Job, fields: dict[str, Any]) -> Voice:
    """Keep the voice a finished job used, with the embedding the worker reported."""
    given = sorted({"seed", "spk_emb"} & set(fields))
    if given:
        raise ApiError(400, f"{given[0]} comes from the job: give only the voice's name and details", given[0])
    if not job.voice_embedding:
        raise ApiError(409, f"job {job.id} has not reported its voice yet (it is {job.status})")
    return create(
        {**fields, "spk_emb": job.voice_embedding} if job.voice_seed is None else {**fields, "seed": job.voice_seed}
    )


def describe(voice: Voice) -> dict[str, Any]:
    return {
        "id": voice.id,
        "name": voice.name,
        "seed": voice.seed,
        "spk_emb": voice.spk_emb,
        "tags": [tag.name for tag in voice.tags],
        "description": voice.description,
        "gender": voice.gender,
        "age": voice.age,
        "rating": voice.rating,
        "favourite": voice.favourite,
        "created_at": voice.created_at.isoformat(),
        "updated_at": voice.updated_at.isoformat(),
        "editable": voice.may_be_changed_by(access.current_key()),
    }


def export() -> list[dict[str, Any]]:
    exported = []
    for voice in find([], None):
        entry = describe(voice)
        for key in ("id", "created_at", "updated_at", "editable"):
            del entry[key]
        exported.append(entry)
    return exported


def import_(entries: Any) -> dict[str, list[str]]:
    """Add exported voices; a name already in the catalog is skipped, never overwritten. Every entry is
    checked whole, skipped or not: a list is imported all or none, whatever the catalog holds."""
    if not isinstance(entries, list):
        raise ApiError(400, "the body must be a JSON list of voices (as GET /api/voices/export gives)", "body")
    added, skipped = [], []
    for position, entry in enumerate(entries):
        if not isinstance(entry, dict) or not entry.get("spk_emb"):
            raise ApiError(400, f"voice {position} must be an object with a name and spk_emb", "body")
        voice = Voice(
            name=_name(entry.get("name")),
            seed=_seed(entry["seed"]) if entry.get("seed") is not None else None,
            spk_emb=_embedding(entry["spk_emb"]),
            owner_key_id=_caller_key_id(),
        )
        update(voice, {k: v for k, v in entry.items() if k not in ("name", "seed", "spk_emb")}, commit=False)
        if named(voice.name) is not None:
            skipped.append(voice.name)
            continue
        db.session.add(voice)
        added.append(voice.name)
    db.session.commit()
    return {"added": added, "skipped": skipped}


def embedding_from_worker(voice: int | Blend, field: str) -> str:
    """Ask a worker: deriving an embedding from a seed or a blend needs the model, which the web app never
    loads. A 503 naming ``field`` when none answers."""
    try:
        return (
            backends.current()
            .celery.send_task(EMBEDDING_TASK_NAME, kwargs={"voice": voice_argument(voice)})
            .get(timeout=EMBEDDING_TIMEOUT_S)
        )
    except InvalidRequest as error:  # the worker could not use the voice (an embedding of another width)
        raise InvalidRequest(field, error.message) from None
    except Exception as error:  # noqa: BLE001 - any failure here means no worker could answer
        raise ApiError(
            503,
            f"no worker answered for the embedding of {f'seed {voice}' if field == 'seed' else 'the blend'} ({error});"
            " start workers or give spk_emb instead",
            field,
        ) from None


def normalise_tags(tags: list[str]) -> list[str]:
    """Tags as stored: lower-case, without surrounding spaces, control or invisible characters."""
    normalised = (drop_invisible(tag).strip().lower() for tag in tags)
    return sorted({tag for tag in normalised if tag})


def _tags(value: Any) -> list[Tag]:
    texts = isinstance(value, list) and all(isinstance(tag, str) for tag in value)
    names = normalise_tags(value) if texts else []
    # Lengths are checked as sent (as the description's maxLength counts) and as stored: lower-casing may
    # lengthen a tag ("İ" becomes "i" and a combining dot).
    if not texts or any(len(text) > MAX_TAG_CHARS for text in value + names):
        raise ApiError(400, f"tags must be a list of texts of at most {MAX_TAG_CHARS} characters", "tags")
    tags = []
    for name in names:
        tag = db.session.execute(db.select(Tag).where(Tag.name == name)).scalar_one_or_none()
        tags.append(tag or Tag(name=name))
    return tags


def _name(value: Any) -> str:
    """A voice's name as stored. Its length is counted as sent (as the description's maxLength counts);
    what is left without invisible characters and surrounding spaces must not be empty."""
    name = drop_invisible(value).strip() if isinstance(value, str) and len(value) <= MAX_NAME_CHARS else ""
    if not name:
        raise ApiError(
            400, f"name is required: text of at most {MAX_NAME_CHARS} characters, some of them visible", "name"
        )
    # A catalog voice named like an OpenAI voice is what every job asking for the name is spoken in.
    if name in OPENAI_VOICE_SEEDS and not _caller_is_admin():
        raise ApiError(
            403,
            f"{name!r} is an OpenAI voice name, which only an admin key may give a catalog voice: every "
            "job asking for it (on /api/jobs, /v1/audio/speech, the pages) would be spoken in that voice",
            "name",
        )
    return name


def _optional_text(value: Any, field: str, limit: int) -> str | None:
    """A text field as stored (without control and invisible characters), or None."""
    text = drop_invisible(value) if isinstance(value, str) and len(value) <= limit else None
    if value is not None and text is None:
        raise ApiError(400, f"{field} must be text of at most {limit} characters", field)
    return text


def _caller_is_admin() -> bool:
    """Whether the caller holds an admin key; with keys off there are no keys, and everyone is."""
    key = access.current_key()
    return key is None or key.is_admin


def _caller_key_id() -> int | None:
    """The key a new voice or preview belongs to (None with keys off)."""
    key = access.current_key()
    return key.id if key is not None else None


def _seed(value: Any) -> int:
    seed = as_integer(value)
    if seed is None or not 0 <= seed <= MAX_SEED:
        raise ApiError(400, f"seed must be an integer from 0 to {MAX_SEED}", "seed")
    return seed


def _embedding(value: Any) -> str:
    try:
        parsed = parse_voice(value)
    except InvalidRequest:
        parsed = None
    if not isinstance(parsed, str):
        raise ApiError(400, "spk_emb must be a ChatTTS speaker-embedding string", "spk_emb")
    return parsed


def _commit_unique(name: str) -> None:
    from sqlalchemy.exc import IntegrityError

    try:
        db.session.commit()
    except IntegrityError:
        db.session.rollback()
        raise ApiError(409, f"a voice named {name!r} already exists", "name") from None
