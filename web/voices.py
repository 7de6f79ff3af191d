"""The voice catalog: create, find by tags, text and kind, edit, export and import.

A voice is of one kind (:class:`web.models.VoiceKind`): a seed, an embedding, a clip or a blend of
other voices. Every kind but a clip keeps the embedding jobs speak (a clip voice keeps its speaker sample
and the clip's words instead); a blend also keeps its parts, which it is shown and exported by.

The catalog is shared: every key finds, reads and speaks every voice. A voice belongs to the key that
made it (by create, import or from a job), and only that key or an admin key may change or delete it.
With keys off there are no keys, and anyone may. Names, tags and descriptions follow the policy of job
texts: control and invisible characters are dropped (:func:`chattts_farm.text.drop_invisible`).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict
from typing import Any

from sqlalchemy import or_

from chattts_farm.callbacks import CallbackPolicy
from chattts_farm.contract import (
    DEFAULT_VOICE_SEED,
    EMBEDDING_TASK_NAME,
    MAX_SEED,
    OPENAI_VOICE_SEEDS,
    SPEAKER_SAMPLE_TASK_NAME,
    Blend,
    InvalidRequest,
    SpeakerSample,
    SynthesisRequest,
    as_integer,
    looks_like_embedding,
    mix_parts,
    parse_voice,
    transcript_of,
    voice_argument,
)
from chattts_farm.text import drop_invisible
from web import access, backends, clips
from web.errors import ApiError
from web.models import Job, JobStatus, Tag, Voice, VoiceKind, db, voice_tags

EMBEDDING_TIMEOUT_S = 60
# Encoding a clip is a few convolutions over its mel spectrogram: well under a second on a worker's CPU.
SPEAKER_SAMPLE_TIMEOUT_S = 60
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
_DETAILS = (*_TEXT_FIELDS, "rating", "favourite")
# The search text is matched literally: LIKE's wildcards and its escape character are escaped.
_LIKE_ESCAPE = "\\"
_LIKE_SPECIAL = str.maketrans({"%": "\\%", "_": "\\_", "\\": "\\\\"})
# What a voice is made of, as create and import take it (one of these), and as an export carries each
# kind: enough to make the voice again in another farm. A seed's embedding travels with it, as the seed
# is the voice only on the model build that drew it; a blend travels as its parts, mixed again where it
# is imported. A clip voice travels as its speaker sample and transcript (made here only from an uploaded
# clip, :func:`create_from_clip`, or by import).
_MADE_OF = ("seed", "spk_emb", "mix")
_CLIP_MADE_OF = ("spk_smp", "txt_smp")
_EXPORTED_BY_KIND = {
    VoiceKind.SEED: ("seed", "spk_emb"),
    VoiceKind.EMBEDDING: ("spk_emb",),
    VoiceKind.CLIP: _CLIP_MADE_OF,
    VoiceKind.BLEND: ("mix",),
}


def find(tags: list[str], query: str | None, kind: str | None = None) -> list[Voice]:
    """Voices carrying every tag given, whose name or description contains the query text, of the kind
    given (any when None; a 400 naming ``kind`` for a kind there is not)."""
    select = db.select(Voice).order_by(Voice.favourite.desc(), Voice.rating.desc(), Voice.name)
    if kind is not None:
        if kind not in VoiceKind.ALL:
            raise ApiError(400, f"kind must be one of {', '.join(VoiceKind.ALL)}", "kind")
        select = select.where(Voice.kind == kind)
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


def resolve(value: Any, field: str = "voice") -> Voice | int | str | Blend | SpeakerSample | None:
    """A job's voice: a seed, an OpenAI voice name's seed, an embedding string or a blend (whose parts may
    be any of these and catalog voices, :func:`blend`), else the catalog voice the text names (None when it
    names none). A catalog voice named like an OpenAI voice is spoken instead of its seed: that is how an
    admin gives the name another voice (see :func:`_name`). :class:`InvalidRequest` naming ``field`` for a
    value that is neither a seed, an embedding, a blend nor a name."""
    if isinstance(value, dict) and "mix" in value:
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
    a 422 naming ``field`` for a part naming no voice, :class:`InvalidRequest` for any other fault (a
    voice from a reference clip among them: it has no embedding to mix)."""
    return _catalog_blend(value, field)[0]


def _catalog_blend(value: dict, field: str) -> tuple[Blend, list[dict]]:
    """The blend (as :func:`blend` reads it) and its parts as a catalog voice keeps them (``Voice.mix``):
    each part's seed or embedding and weight, and the id of the catalog voice it named, if it named one."""
    parts, sources = [], []
    for number, part in enumerate(mix_parts(value, field), 1):
        named_voice = to_speak(part["voice"], field) if isinstance(part["voice"], str) else part["voice"]
        if isinstance(named_voice, Voice) and named_voice.kind == VoiceKind.CLIP:
            raise InvalidRequest(
                field,
                f"part {number} of the blend, {named_voice.name!r}, is a voice from a reference clip: a speaker"
                " sample, not a speaker embedding, so it does not mix",
            )
        parts.append({**part, "voice": argument(named_voice)} if isinstance(part["voice"], str) else part)
        sources.append(named_voice.id if isinstance(named_voice, Voice) else None)
    mixed = parse_voice({"mix": parts}, field)
    kept = [
        {**asdict(part), **({"voice_id": source} if source is not None else {})}
        for part, source in zip(mixed.mix, sources, strict=True)
    ]
    return mixed, kept


def blend_parts(voice: Voice) -> list[dict[str, Any]]:
    """A blend's parts as ``POST /api/voices`` takes them: a catalog voice it mixed by its name (and
    ``voice_id``) while that voice is still in the catalog under a name that speaks it, any other part as
    the seed or embedding it mixed. Empty for voices of other kinds."""
    parts = []
    for part in voice.mix or []:
        source = by_id(part["voice_id"]) if "voice_id" in part else None
        if source is not None and source.spk_emb == part["voice"] and _spoken_by_name(source):
            parts.append({"voice": source.name, "weight": part["weight"], "voice_id": source.id})
        else:
            parts.append({"voice": part["voice"], "weight": part["weight"]})
    return parts


def _spoken_by_name(voice: Voice) -> bool:
    """Whether a job naming the voice's name gets this voice: a name that reads as a seed or an OpenAI
    voice name (only an admin can give those) would get that instead."""
    try:
        return resolve(voice.name) is voice
    except InvalidRequest:
        return False


def to_speak(value: Any, field: str = "voice") -> Voice | int | str | Blend | SpeakerSample:
    """A voice a job may speak in (as :func:`resolve` reads it); a 422 naming ``field`` for a name that is
    neither an OpenAI voice name nor a catalog voice's (:class:`InvalidRequest`, a 400, for a value that
    is no voice at all)."""
    return all_to_speak([value], field)[0]


def all_to_speak(values: list[Any], field: str) -> list[Voice | int | str | Blend | SpeakerSample]:
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


def job_request(
    arguments: dict[str, Any],
    *,
    max_text_chars: int,
    callbacks: CallbackPolicy | None,
    voices_read: dict[str, Any] | None = None,
) -> tuple[SynthesisRequest, Voice | None]:
    """A job's request from its fields as the API takes them, and the catalog voice it speaks in, if any:
    ``voice_id``, or ``voice`` holding a catalog name, else ``voice`` as :func:`to_speak` reads it (a
    blend's parts may be catalog names). ``voices_read`` keeps the voices read so far, by their fields,
    for many jobs at once (a batch's)."""
    if voices_read is None:
        voice = _job_voice(arguments)
    else:
        asked = json.dumps({k: arguments[k] for k in ("voice_id", "voice") if k in arguments}, sort_keys=True)
        voice = voices_read[asked] if asked in voices_read else voices_read.setdefault(asked, _job_voice(arguments))
    arguments = {**{k: v for k, v in arguments.items() if k != "voice_id"}, "voice": argument(voice)}
    request = SynthesisRequest.from_arguments(arguments, max_text_chars=max_text_chars, callbacks=callbacks)
    return request, voice if isinstance(voice, Voice) else None


def _job_voice(arguments: dict[str, Any]) -> Voice | int | str | Blend | SpeakerSample:
    if "voice_id" in arguments:
        if "voice" in arguments:
            raise ApiError(400, "give voice or voice_id, not both", "voice_id")
        voice_id = as_integer(arguments["voice_id"])
        if voice_id is None:
            raise ApiError(400, "voice_id must be the integer id of a catalog voice", "voice_id")
        voice = by_id(voice_id)
        if voice is None:
            raise ApiError(422, f"no voice with id {voice_id} in the catalog", "voice_id")
        return voice
    return to_speak(arguments.get("voice", DEFAULT_VOICE_SEED))


def argument(voice: Voice | int | str | Blend | SpeakerSample) -> int | str | dict:
    """What a job's ``voice`` argument holds for a voice: a catalog voice's embedding (or, for one from a
    reference clip, its speaker sample and words), else the seed, embedding, blend or sample itself."""
    if isinstance(voice, Voice):
        clip = voice.kind == VoiceKind.CLIP
        return voice_argument(SpeakerSample(voice.spk_smp, voice.txt_smp)) if clip else voice.spk_emb
    return voice_argument(voice)


def create(fields: dict[str, Any]) -> Voice:
    """A new voice from a name and a seed, an embedding or a blend (``mix``, the parts of a blend as jobs
    take it); the embedding is always stored, a blend's mixed by a worker as jobs speak it, and a blend
    keeps its parts."""
    name = _name(fields.get("name"))
    given = sorted(set(_MADE_OF) & set(fields))
    if len(given) != 1:
        raise ApiError(400, "give exactly one of seed, spk_emb or mix", given[1] if given else "seed")
    seed = _seed(fields["seed"]) if "seed" in fields else None
    mixed, kept_mix = _catalog_blend({"mix": fields["mix"]}, "mix") if "mix" in fields else (None, None)
    voice = _new_voice(
        name,
        fields,
        seed=seed,
        spk_emb=_embedding(fields["spk_emb"]) if "spk_emb" in fields else None,
        mix=kept_mix,
    )
    # Only once every field is valid: a worker may take up to a minute to answer.
    if voice.spk_emb is None:
        voice.spk_emb = embedding_from_worker(seed if seed is not None else mixed, given[0])
    return _add(voice)


def _new_voice(name: str, fields: dict[str, Any], **made_of: Any) -> Voice:
    """A voice of the caller's, not yet added: what it is made of as given, its details from ``fields``
    (every field but its name and what it is made of; a 400 naming one that is not a detail)."""
    voice = Voice(name=name, owner_key_id=_caller_key_id(), **made_of)
    details = {key: value for key, value in fields.items() if key not in ("name", *_MADE_OF)}
    update(voice, details, commit=False)
    return voice


def _add(voice: Voice) -> Voice:
    db.session.add(voice)
    _commit_unique(voice.name)
    return voice


def create_from_clip(form: dict[str, str], clip: Any) -> Voice:
    """A new voice from a reference clip (``clip``, the uploaded file, or None) and its words
    (``transcript``): the clip checked and decoded here, encoded into ChatTTS's speaker sample by a
    worker, and only then stored, so that no voice without its sample is ever seen. ``tags`` are
    comma-separated; ``description``, ``gender`` and ``age`` as for any voice."""
    unknown = sorted(set(form) - {"name", "tags", "transcript", "csrf_token", *_TEXT_FIELDS})
    if unknown:
        raise ApiError(400, f"a voice from a clip takes name, tags, transcript and audio, not {unknown[0]}", unknown[0])
    name = _name(form.get("name"))
    try:
        transcript = transcript_of(form.get("transcript"))
    except InvalidRequest as error:
        raise ApiError(400, str(error), "transcript") from None
    voice = Voice(name=name, txt_smp=transcript, owner_key_id=_caller_key_id())
    details = {field: form[field] for field in _TEXT_FIELDS if field in form}
    update(voice, {**details, "tags": form.get("tags", "").split(",")}, commit=False)
    if named(name) is not None:  # before the worker's time is spent on it
        raise ApiError(409, f"a voice named {name!r} already exists", "name")
    if clip is None or not getattr(clip, "filename", None):
        raise ApiError(400, "audio: the clip is required, a WAV, FLAC, Ogg or MP3 file as the form's audio", "audio")
    samples = clips.clip_samples(clip.stream)
    voice.spk_smp = _from_worker(
        SPEAKER_SAMPLE_TASK_NAME,
        {"audio": samples},
        "audio",
        "the clip's speaker sample",
        "and send the clip again",
        SPEAKER_SAMPLE_TIMEOUT_S,
    )
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
        SynthesisRequest.from_arguments(
            # Someone waits at the voice's page to hear it.
            {"text": PREVIEW_TEXT, "voice": argument(voice), "priority": "interactive"},
            max_text_chars=max_text_chars,
        ),
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
                {"text": text, "voice": argument(voice), "priority": "interactive"},  # heard at the workshop
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
    """Keep the voice a finished job used, with the embedding the worker reported: a blend with its parts
    as the job sent them (seeds and embeddings)."""
    given = sorted(set(_MADE_OF) & set(fields))
    if given:
        raise ApiError(400, f"{given[0]} comes from the job: give only the voice's name and details", given[0])
    if job.voice_sample is not None:
        raise ApiError(
            409, f"job {job.id} spoke a voice from a reference clip: keep the clip's voice (upload the clip) instead"
        )
    if not job.voice_embedding:
        raise ApiError(409, f"job {job.id} has not reported its voice yet (it is {job.status})")
    if job.voice_mix is not None:
        kept_mix = job.voice_mix["mix"]
        return _add(_new_voice(_name(fields.get("name")), fields, spk_emb=job.voice_embedding, mix=kept_mix))
    return create(
        {**fields, "spk_emb": job.voice_embedding} if job.voice_seed is None else {**fields, "seed": job.voice_seed}
    )


def describe(voice: Voice) -> dict[str, Any]:
    return {
        "id": voice.id,
        "name": voice.name,
        "kind": voice.kind,
        "seed": voice.seed,
        "spk_emb": voice.spk_emb,
        "spk_smp": voice.spk_smp,
        "txt_smp": voice.txt_smp,
        "mix": blend_parts(voice) if voice.kind == VoiceKind.BLEND else None,
        "tags": [tag.name for tag in voice.tags],
        "description": voice.description,
        "gender": voice.gender,
        "age": voice.age,
        "rating": voice.rating,
        "favourite": voice.favourite,
        "created_at": voice.created_at.isoformat(),
        "updated_at": voice.updated_at.isoformat(),
        "editable": voice.may_be_changed_by(access.current_key()),
        # The name of the key that made the voice; None with keys off, or when it was made before voices
        # had owners.
        "owner": voice.owner.name if voice.owner is not None else None,
    }


def export() -> list[dict[str, Any]]:
    """Every voice as import takes it: its name, kind, details and what it is made of (``_EXPORTED_BY_KIND``),
    a blend's parts by the names of the catalog voices it mixed, so that they resolve where it is imported."""
    exported = []
    for voice in find([], None):
        described = describe(voice)
        details = {key: described[key] for key in ("name", "kind", "tags", *_DETAILS)}
        made_of = {key: described[key] for key in _EXPORTED_BY_KIND[voice.kind]}
        if voice.kind == VoiceKind.BLEND:  # ids are this farm's
            made_of["mix"] = [{"voice": part["voice"], "weight": part["weight"]} for part in made_of["mix"]]
        exported.append({**details, **made_of})
    return exported


def import_(entries: Any) -> dict[str, list[str]]:
    """Add exported voices; a name already in the catalog is skipped, never overwritten. Every entry is
    checked whole, skipped or not: a list is imported all or none, whatever the catalog holds. A blend's
    parts may name voices of the catalog or of the same list (a 422 naming ``mix`` and the part for one
    naming neither); a worker mixes its embedding here."""
    if not isinstance(entries, list):
        raise ApiError(400, "the body must be a JSON list of voices (as GET /api/voices/export gives)", "body")
    checked = [_imported(position, entry) for position, entry in enumerate(entries)]
    # A tag new to the catalog is one row, however many of the list's voices carry it.
    new_tags: dict[str, Tag] = {}
    for voice, _ in checked:
        voice.tags = [new_tags.setdefault(tag.name, tag) for tag in voice.tags]
    added, skipped = [], []
    # Blends last: their parts may name voices of this list (no blend mixes another).
    for position, (voice, exported_blend) in sorted(enumerate(checked), key=lambda numbered: bool(numbered[1][1])):
        mixed = None
        if exported_blend:
            mixed, voice.mix = _imported_blend(position, voice.name, exported_blend)
        if named(voice.name) is not None:
            skipped.append(voice.name)
            continue
        if mixed is not None:
            voice.spk_emb = embedding_from_worker(mixed, "mix")
        db.session.add(voice)
        added.append(voice.name)
    db.session.commit()
    return {"added": added, "skipped": skipped}


def _imported(position: int, entry: Any) -> tuple[Voice, dict | None]:
    """An exported voice, checked but not added, and for a blend its parts as exported (``{"mix": ...}``),
    resolved only once the list's other voices are in. A 400 naming ``body`` for an entry of no kind or a
    clip's sample and words that are none, ``kind`` for one of a kind its fields are not, and a field that
    is no part of its kind (a blend's or a clip voice's seed or embedding)."""
    from_clip = isinstance(entry, dict) and any(key in entry for key in _CLIP_MADE_OF)
    if not isinstance(entry, dict) or not ("mix" in entry or entry.get("spk_emb") or from_clip):
        raise ApiError(
            400, f"voice {position} must be an object with a name and spk_emb, mix, or spk_smp and txt_smp", "body"
        )
    if "mix" in entry:
        kind = VoiceKind.BLEND
    elif from_clip:
        kind = VoiceKind.CLIP
    else:
        kind = VoiceKind.SEED if entry.get("seed") is not None else VoiceKind.EMBEDDING
    if entry.get("kind", kind) != kind:
        raise ApiError(
            400, f"voice {position}: its kind {entry['kind']!r} is not what its fields make it ({kind!r})", "kind"
        )
    name = _name(entry.get("name"))
    fields = {key: value for key, value in entry.items() if key not in ("kind", *_CLIP_MADE_OF)}
    if kind == VoiceKind.BLEND:
        given = sorted({"seed", "spk_emb", *_CLIP_MADE_OF} & set(entry))
        if given:
            raise ApiError(400, f"voice {position} is a blend: its {given[0]} comes from its parts (mix)", given[0])
        return _new_voice(name, fields), {"mix": entry["mix"]}
    if kind == VoiceKind.CLIP:
        given = sorted({"seed", "spk_emb"} & set(entry))
        if given:
            raise ApiError(
                400, f"voice {position} is a clip voice: it is a speaker sample and words, with no {given[0]}", given[0]
            )
        try:
            sample = parse_voice({key: entry[key] for key in _CLIP_MADE_OF if key in entry}, "body")
        except InvalidRequest as error:
            raise InvalidRequest("body", f"voice {position} ({name!r}): {error.message}") from None
        return _new_voice(name, fields, spk_smp=sample.spk_smp, txt_smp=sample.txt_smp), None
    seed = _seed(entry["seed"]) if entry.get("seed") is not None else None
    return _new_voice(name, fields, seed=seed, spk_emb=_embedding(entry["spk_emb"])), None


def _imported_blend(position: int, name: str, exported: dict) -> tuple[Blend, list[dict]]:
    """An imported blend's parts resolved in this catalog (:func:`_catalog_blend`); a fault names the voice
    of the list, and the field ``mix``."""
    try:
        return _catalog_blend(exported, "mix")
    except InvalidRequest as error:
        raise InvalidRequest("mix", f"voice {position} ({name!r}): {error.message}") from None
    except ApiError as error:
        raise ApiError(error.status, f"voice {position} ({name!r}): {error.message}", "mix") from None


def embedding_from_worker(voice: int | Blend, field: str) -> str:
    """Ask a worker: deriving an embedding from a seed or a blend needs the model, which the web app never
    loads. A 503 naming ``field`` when none answers."""
    what = f"the embedding of {f'seed {voice}' if field == 'seed' else 'the blend'}"
    arguments = {"voice": voice_argument(voice)}
    return _from_worker(EMBEDDING_TASK_NAME, arguments, field, what, "or give spk_emb instead", EMBEDDING_TIMEOUT_S)


def _from_worker(task: str, arguments: dict[str, Any], field: str, what: str, advice: str, timeout_s: float) -> str:
    """A worker's answer to ``task``: :class:`InvalidRequest` naming ``field`` when it could not use the
    argument, a 503 naming it (with ``advice``) when no worker answered."""
    try:
        return backends.current().celery.send_task(task, kwargs=arguments).get(timeout=timeout_s)
    except InvalidRequest as error:  # the worker could not use the voice (an embedding of another width)
        raise InvalidRequest(field, error.message) from None
    except Exception as error:  # noqa: BLE001 - any failure here means no worker could answer
        raise ApiError(503, f"no worker answered for {what} ({error}); start workers {advice}", field) from None


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
