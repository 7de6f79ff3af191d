"""The farm's task contract: names, arguments, validation and error types.

Torch-free and Celery-free on purpose: the web app, outside services and the worker all import this
one module, so what a valid request is has exactly one definition.
"""

from __future__ import annotations

import base64
import binascii
import functools
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from chattts_farm import ssml
from chattts_farm.callbacks import CallbackPolicy, CallbackRefused
from chattts_farm.speech_length import expected_seconds
from chattts_farm.text import NOTHING_SPEAKABLE, drop_invisible, is_speakable, is_ssml

TASK_NAME = "chattts.synthesize"
HEALTH_TASK_NAME = "chattts.health"
# voice_embedding(seed=int) -> the speaker-embedding string the seed names on the worker's model;
# voice_embedding(voice=...) -> that of any voice parse_voice reads (a blend's is its mix).
EMBEDDING_TASK_NAME = "chattts.voice_embedding"
# speaker_sample(audio=<base64 of a clip's samples, as CLIP_PCM says>) -> ChatTTS's speaker sample of the clip
# (``spk_smp``, the DVAE encoder's codes of its mel spectrogram, as ``Chat.sample_audio_speaker`` writes them).
SPEAKER_SAMPLE_TASK_NAME = "chattts.speaker_sample"
DEFAULT_QUEUE = "tts"
# Workers consume Celery's own default queue too, so a plain send_task without routing reaches them.
CELERY_DEFAULT_QUEUE = "celery"
# A job's priority, first to last: interactive jobs (someone waits at a form or a speech call) take the
# next free engine slot ahead of waiting normal and bulk ones (see worker/engine/scheduler.py for how
# bulk work still progresses), and each class waits on a Celery queue of its own (PRIORITY_QUEUES).
PRIORITIES = ("interactive", "normal", "bulk")
DEFAULT_PRIORITY = "normal"
# A normal job waits on the farm's queue as jobs did before priorities (so a caller that names no
# queue or no priority gets a normal one); the two others on their own. Workers read the queues in
# this order (see chattts_farm.celery_client).
PRIORITY_QUEUES = {
    "interactive": f"{DEFAULT_QUEUE}.interactive",
    "normal": DEFAULT_QUEUE,
    "bulk": f"{DEFAULT_QUEUE}.bulk",
}
# The queues jobs wait on, in the order workers read them (Celery's default queue takes a plain
# client's job sent without the farm's routing: a normal one).
JOB_QUEUES = (PRIORITY_QUEUES["interactive"], DEFAULT_QUEUE, CELERY_DEFAULT_QUEUE, PRIORITY_QUEUES["bulk"])
# The state a running synthesis reports, with meta {"progress": 0..1, "segment": i, "segments": n}.
PROGRESS_STATE = "PROGRESS"

# Keys of the dict a successful chattts.synthesize returns (all JSON-able). The audio is in the audio
# store (chattts_farm.audio_store, CHATTTS_FARM_AUDIO_STORE) under ``audio_key``, the store's key made
# from the job's id (a Redis key, or a path under the store's directory or prefix); ``audio_url`` says
# where a caller finds it (a file: or s3:// URL; None for the Redis store). fetch_audio(result) in
# chattts_farm.audio_store reads it from any store. ``timeline`` places each segment in the audio:
# [{"index", "text", "start_s", "end_s"}], counted in the joined audio's samples, silences included
# (pauses between segments, SSML breaks; sentence-level: ChatTTS's codes say nothing of where its words fall).
# ``received_at``, ``started_at`` and ``finished_at`` are epoch seconds: a worker took the job off its queue,
# its engine began it, the worker had its audio stored; so a caller that knows when it sent the job sees how
# long it waited in the queue and how long for a place in the engine.
RESULT_FIELDS = (
    "job_id",
    "format",
    "mime_type",
    "sample_rate",
    "duration_s",
    "segments",
    "tokens",
    "audio_key",
    "audio_url",
    "quality",
    "worker",
    "batch_size",
    "model",
    "model_info",
    "seed",
    "voice_embedding",
    "timings",
    "memory",
    "timeline",
    "received_at",
    "started_at",
    "finished_at",
)

DEFAULT_VOICE_SEED = 2222
DEFAULT_SPEED = 5  # ChatTTS's [speed_5], its normal rate (speeds are 1..9)
MAX_SEED = 2**32 - 1

# OpenAI's voice names, lower-case as its API takes them (a fixed list), each a fixed ChatTTS voice: every
# entry point takes them wherever it takes a voice (parse_voice). A seed draws a speaker embedding from a
# generator seeded with it (worker/engine_process/voices.py), so distinct seeds are unrelated voices
# whichever they are; nobody has listened to these. They are spread evenly over the seed range, 390
# million apart, clear of the small seeds people type and of the default 2222. The web speaks a catalog
# voice of the same name instead (web.voices.resolve): that is how an admin gives a name another voice
# there; a Celery caller, which has no catalog, always gets the seed.
OPENAI_VOICE_SEEDS = {
    "alloy": 390_000_000,
    "ash": 780_000_000,
    "ballad": 1_170_000_000,
    "coral": 1_560_000_000,
    "echo": 1_950_000_000,
    "fable": 2_340_000_000,
    "nova": 2_730_000_000,
    "onyx": 3_120_000_000,
    "sage": 3_510_000_000,
    "shimmer": 3_900_000_000,
    "verse": 4_290_000_000,
}

MIME_TYPES = {
    "wav": "audio/wav",
    "flac": "audio/flac",
    "ogg": "audio/ogg",
    "mp3": "audio/mpeg",
}
FORMATS = tuple(MIME_TYPES)

# A ChatTTS speaker embedding is base16384 text (CJK-range code points), never short.
# The pattern is one Python and JSON Schema (ECMA-262) read alike: the web's description uses it.
EMBEDDING_PATTERN = r"^[\u4e00-\u8dff\u3d00-\u3d0f]{16,}$"
_EMBEDDING = re.compile(EMBEDDING_PATTERN)
# An embedding holds one float16 value per dimension of the GPT: 768 in ChatTTS's model, the widest the
# farm runs (synthetic-tiny is narrower). Workers refuse an embedding of another width.
MAX_SPEAKER_DIM = 768
# Embedding strings are bounded by length before anything decodes them: the LZMA data inside could
# otherwise expand a 100 KB request to gigabytes. Whatever the preset, LZMA2 stores data it cannot
# compress as it is, with a 3-byte chunk header and an end byte (1540 bytes for 768 values), and
# base16384 writes 14 bits a character (880 characters). The bound leaves a quarter more: 1100.
_LONGEST_EMBEDDING_BYTES = 2 * MAX_SPEAKER_DIM + 3 + 1
MAX_EMBEDDING_CHARS = math.ceil(_LONGEST_EMBEDDING_BYTES * 8 / 14 * 1.25)
# JSON's \uXXXX escapes can name one half of a UTF-16 surrogate pair alone, and Python keeps it as a
# code point of its own: text that no UTF-8 encoder, database or model takes.
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
_SEED_DIGITS = re.compile(r"[0-9]+")
# A blend mixes at most this many voices, each weighted from 0 to MAX_MIX_WEIGHT (not all 0).
MAX_MIX_PARTS = 8
MAX_MIX_WEIGHT = 1000.0

# A voice from a reference clip: 1 to 30 seconds of speech, sent to the speaker-sample task as 16-bit
# little-endian mono samples at ChatTTS's rate (its DVAE reads a 24 kHz mel spectrogram), with the clip's
# words (``txt_smp``), which ChatTTS puts in every prompt before the text to speak.
CLIP_SAMPLE_RATE = 24_000
CLIP_PCM = "16-bit little-endian mono samples at 24 kHz"
MIN_CLIP_S = 1.0
MAX_CLIP_S = 30.0
MAX_TRANSCRIPT_CHARS = 500
# ChatTTS's DVAE draws one code per codebook for every two mel frames (hop 256, centred: one frame more).
SAMPLE_CODEBOOKS = 4
MAX_SAMPLE_CODES = math.ceil((int(MAX_CLIP_S * CLIP_SAMPLE_RATE) // 256 + 1) / 2)
# A speaker sample is base16384 text as an embedding is: its shape (two uint16), then its codes as uint16,
# LZMA2-compressed. Bounded by length as embeddings are (see MAX_EMBEDDING_CHARS), a quarter over the
# longest a 30 s clip's codes take stored uncompressed (3-byte chunk headers every 64 KiB, an end byte).
_LONGEST_SAMPLE_BYTES = 4 + 2 * SAMPLE_CODEBOOKS * MAX_SAMPLE_CODES + 3 * 2 + 1
MAX_SAMPLE_CHARS = math.ceil(_LONGEST_SAMPLE_BYTES * 8 / 14 * 1.25)
# ChatTTS's tags that shape a prompt ([Stts][spk_emb]...[Ptts]): taken out of a transcript, as ChatTTS
# takes them out of the text it speaks (Speaker.decorate_code_prompts), so a transcript cannot reshape it.
_PROMPT_TAGS = re.compile(r"\[(?:Stts|Ptts|spk_emb|empty_spk)\]")


def worker_queue(kind: str, index: int) -> str:
    """The queue of one worker (``gpu0``, ``cpu1``), for jobs pinned to it."""
    return f"{kind}{index}"


def queue_of_worker(worker_name: str) -> str:
    """The queue a worker process takes pinned jobs from: ``gpu0`` for ``gpu0@host`` and for its GPU's
    other Celery processes (``gpu0.1@host``)."""
    return worker_name.split("@")[0].split(".")[0]


class FarmError(Exception):
    """Base of the errors the farm reports to its callers."""


class InvalidRequest(FarmError):
    """A request argument is unusable. ``field`` names it so a form or client can point at it.

    The constructor takes exactly ``(field, message)`` and passes them as ``args``, so Celery can
    rebuild the exception on the client side from its stored arguments.
    """

    def __init__(self, field: str, message: str):
        super().__init__(field, message)
        self.field = field
        self.message = message

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class ModelUnavailable(FarmError):
    """The configured model cannot be loaded; the message says what to set instead."""


class JobCancelled(FarmError):
    """The job was revoked while it waited in a worker or was being synthesised."""


class JobTimeout(FarmError):
    """The job ran past the soft time limit and was stopped."""


class SynthesisFailed(FarmError):
    """Synthesis of this job failed even when it ran alone; the message says how."""


class CallbackFailed(FarmError):
    """A job's callback could not be delivered: its address was refused, or every attempt failed."""


class EngineLost(SynthesisFailed):
    """The engine process running this job died more often than ``CHATTTS_FARM_ENGINE_RETRIES`` allows."""


@dataclass(frozen=True)
class RefineText:
    """ChatTTS's refine-text step, which adds oral fillers, laughs and breaks before speaking."""

    oral: int = 2
    laugh: int = 0
    break_: int = 6

    @property
    def prompt(self) -> str:
        return f"[oral_{self.oral}][laugh_{self.laugh}][break_{self.break_}]"


@dataclass(frozen=True)
class MixPart:
    """One voice of a blend: a seed or an embedding string, and its weight (0..MAX_MIX_WEIGHT)."""

    voice: int | str
    weight: float


@dataclass(frozen=True)
class Blend:
    """A weighted mix of voices that are speaker embeddings (seeds, embedding strings), as parse_voice reads
    ``{"mix": [{"voice": ..., "weight": ...}, ...]}`` (:func:`voice_argument` writes it so again). Plain
    data: the worker mixes the embeddings (worker/engine_process/voices.py)."""

    mix: tuple[MixPart, ...]


@dataclass(frozen=True)
class SpeakerSample:
    """A voice from a reference clip, as ChatTTS takes one: the clip's speaker sample (``spk_smp``, made by
    the ``chattts.speaker_sample`` task) and its words (``txt_smp``). parse_voice reads it from
    ``{"spk_smp": ..., "txt_smp": ...}``; it is no speaker embedding, so no blend mixes it."""

    spk_smp: str
    txt_smp: str


Voice = int | str | Blend | SpeakerSample


@dataclass(frozen=True)
class SynthesisRequest:
    """One validated request. Build it with :meth:`from_arguments`; everything past that trusts it."""

    text: str
    voice: Voice = DEFAULT_VOICE_SEED
    format: str = "wav"
    speed: int = DEFAULT_SPEED
    temperature: float = 0.3
    top_p: float = 0.7
    top_k: int = 20
    repetition_penalty: float = 1.05
    refine_text: RefineText | None = None
    seed: int | None = None
    stream: bool = False  # send the audio to the job's Redis stream as it is made (see chattts_farm.streams)
    # Where the job's status is POSTed, signed, when it ends (see chattts_farm.callbacks).
    callback_url: str | None = None
    priority: str = DEFAULT_PRIORITY  # one of PRIORITIES
    request_id: str = field(default="", compare=False)

    @property
    def voice_seed(self) -> int | None:
        return self.voice if isinstance(self.voice, int) else None

    @functools.cached_property
    def script(self) -> ssml.Script:
        """The text's speech and silences, in order (an SSML document's, as chattts_farm.ssml reads it);
        :class:`InvalidRequest` naming ``text`` for a document outside the subset, which only a request
        built without :meth:`from_arguments` holds."""
        return script_of(self.text)

    @property
    def expected_seconds(self) -> float:
        """How long its speech (each run at its speed) and its breaks are expected to last."""
        return sum(
            expected_seconds(item.text, item.speed or self.speed) if isinstance(item, ssml.Speech) else item.ms / 1000
            for item in self.script
        )

    @classmethod
    def from_arguments(
        cls,
        arguments: dict[str, Any],
        *,
        max_text_chars: int,
        callbacks: CallbackPolicy | None = None,
        request_id: str = "",
    ) -> SynthesisRequest:
        """Validate loosely typed arguments (task kwargs, JSON) into a request.

        Raises :class:`InvalidRequest` naming the first offending field. ``callbacks`` is where this
        farm sends callbacks (a ``callback_url`` is refused without it). ``request_id`` is the job's own
        id, given by the task, never by the caller.
        """
        known = {
            "text",
            "voice",
            "format",
            "speed",
            "temperature",
            "top_p",
            "top_k",
            "repetition_penalty",
            "refine_text",
            "oral",
            "laugh",
            "break",
            "seed",
            "stream",
            "callback_url",
            "priority",
        }
        unknown = sorted(set(arguments) - known)
        if unknown:
            raise InvalidRequest(unknown[0], f"unknown argument; known ones are {', '.join(sorted(known))}")
        refine = _boolean(arguments.get("refine_text", False), "refine_text")

        def given(name: str) -> Any:
            """The argument, or the field's default: the dataclass is the one place defaults live."""
            return arguments.get(name, cls.__dataclass_fields__[name].default)

        defaults = RefineText()
        # Levels are checked even without refine_text: a bad one is a mistake either way.
        levels = RefineText(
            oral=_integer(arguments.get("oral", defaults.oral), "oral", 0, 9),
            laugh=_integer(arguments.get("laugh", defaults.laugh), "laugh", 0, 2),
            break_=_integer(arguments.get("break", defaults.break_), "break", 0, 7),
        )
        return cls(
            text=_text(arguments.get("text"), max_text_chars),
            voice=parse_voice(given("voice")),
            format=_choice(given("format"), "format", FORMATS),
            speed=_integer(given("speed"), "speed", 1, 9),
            temperature=_number(given("temperature"), "temperature", 0.01, 2.0),
            top_p=_number(given("top_p"), "top_p", 0.01, 1.0),
            top_k=_integer(given("top_k"), "top_k", 1, 626),
            repetition_penalty=_number(given("repetition_penalty"), "repetition_penalty", 1.0, 2.0),
            refine_text=levels if refine else None,
            seed=None if given("seed") is None else _integer(given("seed"), "seed", 0, MAX_SEED),
            stream=_boolean(given("stream"), "stream"),
            callback_url=_callback_url(given("callback_url"), callbacks),
            priority=_choice(given("priority"), "priority", PRIORITIES),
            request_id=request_id,
        )

    def as_arguments(self) -> dict[str, Any]:
        """The plain keyword arguments that rebuild this request (the task's, without the job's id; without
        a callback when it has none)."""
        arguments = {**asdict(self), "voice": voice_argument(self.voice)}
        del arguments["request_id"]
        if self.callback_url is None:
            del arguments["callback_url"]
        refine = arguments.pop("refine_text")
        arguments["refine_text"] = refine is not None
        if refine is not None:
            arguments.update(oral=refine["oral"], laugh=refine["laugh"], **{"break": refine["break_"]})
        return arguments


def parse_voice(value: Any, field: str = "voice") -> Voice:
    """A voice is a seed (an integer, or a string of digits), one of OpenAI's voice names (its seed in
    :data:`OPENAI_VOICE_SEEDS`), a ChatTTS speaker-embedding string, or a blend of such voices
    (``{"mix": [{"voice": ..., "weight": ...}, ...]}``, read by :func:`mix_parts`).

    A voice from a reference clip is ``{"spk_smp": ..., "txt_smp": ...}`` (:class:`SpeakerSample`).

    :class:`InvalidRequest` names ``field``: the argument that held the value.
    """
    if isinstance(value, Blend | SpeakerSample):
        return value
    if isinstance(value, dict) and "mix" not in value and set(value) & {"spk_smp", "txt_smp"}:
        return _speaker_sample(value, field)
    if isinstance(value, dict):
        return _blend(value, field)
    if isinstance(value, bool):
        raise InvalidRequest(field, "must be an integer seed or a speaker-embedding string, not a boolean")
    if isinstance(value, float) and (integer := as_integer(value)) is not None:
        value = integer
    if isinstance(value, int):
        if not 0 <= value <= MAX_SEED:
            raise InvalidRequest(field, f"a seed must be between 0 and {MAX_SEED}")
        return value
    if isinstance(value, str):
        stripped = value.strip()
        if stripped in OPENAI_VOICE_SEEDS:
            return OPENAI_VOICE_SEEDS[stripped]
        if _SEED_DIGITS.fullmatch(stripped):
            # int() refuses very long digit strings; any longer than the largest seed is out of range anyway.
            digits = stripped.lstrip("0") or "0"
            return parse_voice(int(digits) if len(digits) <= len(str(MAX_SEED)) else MAX_SEED + 1, field)
        if looks_like_embedding(stripped):
            if len(stripped) > MAX_EMBEDDING_CHARS:
                raise InvalidRequest(
                    field,
                    f"a speaker embedding is at most {MAX_EMBEDDING_CHARS} characters; this one has {len(stripped)}",
                )
            return stripped
        raise InvalidRequest(
            field,
            f"must be an integer seed, an OpenAI voice name ({', '.join(OPENAI_VOICE_SEEDS)})"
            " or a ChatTTS speaker-embedding string",
        )
    raise InvalidRequest(field, f"must be an integer seed or a speaker-embedding string, not {type(value).__name__}")


def voice_argument(voice: Voice) -> int | str | dict:
    """The plain (JSON, msgpack) value :func:`parse_voice` reads back as this voice."""
    if isinstance(voice, Blend):
        return {"mix": [asdict(part) for part in voice.mix]}
    return asdict(voice) if isinstance(voice, SpeakerSample) else voice


def _speaker_sample(value: dict, field: str) -> SpeakerSample:
    if set(value) != {"spk_smp", "txt_smp"}:
        raise InvalidRequest(field, 'a voice from a reference clip is {"spk_smp": ..., "txt_smp": ...}')
    sample = value["spk_smp"]
    if not isinstance(sample, str) or not looks_like_embedding(sample):
        raise InvalidRequest(field, "spk_smp must be a ChatTTS speaker sample (base16384 text)")
    if len(sample.strip()) > MAX_SAMPLE_CHARS:
        raise InvalidRequest(field, f"a speaker sample is at most {MAX_SAMPLE_CHARS} characters")
    try:
        transcript = transcript_of(value["txt_smp"])
    except InvalidRequest as error:
        raise InvalidRequest(field, f"txt_smp {error.message}") from None
    return SpeakerSample(sample.strip(), transcript)


def transcript_of(value: Any) -> str:
    """A reference clip's words as ChatTTS reads them before each text: without control, invisible
    characters and prompt tags; :class:`InvalidRequest` naming ``transcript`` when none are left."""
    if not isinstance(value, str) or len(value) > MAX_TRANSCRIPT_CHARS:
        raise InvalidRequest("transcript", f"must be the clip's words, at most {MAX_TRANSCRIPT_CHARS} characters")
    check_unicode(value, "transcript")
    transcript = _PROMPT_TAGS.sub("", drop_invisible(value)).strip()
    if not is_speakable(transcript):
        raise InvalidRequest("transcript", "must be the clip's words: " + NOTHING_SPEAKABLE)
    return transcript


def clip_samples(audio: Any) -> bytes:
    """The samples the speaker-sample task takes (base64 text of :data:`CLIP_PCM`), checked: whole
    samples, MIN_CLIP_S to MAX_CLIP_S of them; :class:`InvalidRequest` naming ``audio`` otherwise."""
    longest = int(MAX_CLIP_S * CLIP_SAMPLE_RATE) * 2
    if not isinstance(audio, str) or len(audio) > math.ceil(longest / 3) * 4:
        raise InvalidRequest("audio", f"must be base64 text of at most {MAX_CLIP_S:g} s of {CLIP_PCM}")
    try:
        pcm = base64.b64decode(audio, validate=True)
    except binascii.Error:
        raise InvalidRequest("audio", f"must be base64 text of {CLIP_PCM}") from None
    if len(pcm) % 2 or not MIN_CLIP_S <= len(pcm) / 2 / CLIP_SAMPLE_RATE <= MAX_CLIP_S:
        raise InvalidRequest("audio", f"must be {MIN_CLIP_S:g} to {MAX_CLIP_S:g} s of {CLIP_PCM}")
    return pcm


def mix_parts(value: dict, field: str = "voice") -> list[dict]:
    """The parts of a blend as given, each an object with a ``voice`` and an optional ``weight`` (1 when
    left out), their number checked: :class:`InvalidRequest` naming ``field`` for any other shape."""
    parts = value.get("mix")
    if set(value) != {"mix"} or not isinstance(parts, list) or not 1 <= len(parts) <= MAX_MIX_PARTS:
        raise InvalidRequest(
            field, f'a blend is {{"mix": [{{"voice": ..., "weight": ...}}, ...]}} with 1 to {MAX_MIX_PARTS} voices'
        )
    for number, part in enumerate(parts, 1):
        if not isinstance(part, dict) or "voice" not in part or set(part) - {"voice", "weight"}:
            raise InvalidRequest(field, f"part {number} of the blend must be an object with a voice and a weight")
    return parts


def _blend(value: dict, field: str) -> Blend:
    mix = []
    for number, part in enumerate(mix_parts(value, field), 1):
        # Only speaker embeddings mix: a seed or an embedding string is one, a blend or a voice from a
        # reference clip (any voice not written as one value) is not. Refused before it is read: blends in
        # blends would nest without end.
        if isinstance(part["voice"], dict | list | Blend | SpeakerSample):
            raise InvalidRequest(
                field,
                f"part {number} of the blend must be one seed or embedding voice (a blend mixes into none, and a"
                " voice from a reference clip is a speaker sample, not an embedding)",
            )
        try:
            voice = parse_voice(part["voice"], "voice")
            weight = _number(part.get("weight", 1.0), "weight", 0.0, MAX_MIX_WEIGHT)
        except InvalidRequest as error:
            raise InvalidRequest(field, f"part {number} of the blend: {error}") from None
        mix.append(MixPart(voice, weight))
    if not any(part.weight for part in mix):
        raise InvalidRequest(field, "a blend needs a weight above 0 on at least one of its voices")
    return Blend(tuple(mix))


def looks_like_embedding(text: str) -> bool:
    """Whether text is written as a speaker embedding is (base16384), whatever its length: such text is
    taken for an embedding, never for a catalog voice's name."""
    return bool(_EMBEDDING.match(text.strip()))


def check_unicode(value: str, field: str) -> None:
    """Refuse text holding a lone UTF-16 surrogate, naming the field."""
    if _LONE_SURROGATE.search(value):
        raise InvalidRequest(field, "holds half of a UTF-16 surrogate pair (such as \\ud83d alone): not valid Unicode")


def _text(value: Any, max_chars: int) -> str:
    """The text to speak (plain, or an SSML document: see chattts_farm.ssml), without control and invisible
    characters; refused when nothing in it is speech."""
    if not isinstance(value, str):
        raise InvalidRequest("text", "is required and must be a string")
    if not value.strip():
        raise InvalidRequest("text", "is empty")
    if len(value) > max_chars:
        raise InvalidRequest("text", f"has {len(value)} characters; the maximum is {max_chars}")
    check_unicode(value, "text")
    text = drop_invisible(value)
    if is_ssml(text) and not ssml.is_document(text):
        raise InvalidRequest(
            "text",
            "holds SSML tags but is no SSML document: SSML is one <speak>...</speak> around the whole text"
            " (or send plain text: a [uv_break] tag makes a pause)",
        )
    if not any(is_speakable(item.text) for item in script_of(text) if isinstance(item, ssml.Speech)):
        raise InvalidRequest("text", NOTHING_SPEAKABLE)
    return text


def script_of(text: str) -> ssml.Script:
    """The speech and silences of a text, plain or SSML; :class:`InvalidRequest` naming ``text`` says why
    a document is not one the farm reads."""
    try:
        return ssml.script_of(text)
    except ssml.SsmlRefused as refusal:
        raise InvalidRequest("text", str(refusal)) from None


def _callback_url(value: Any, callbacks: CallbackPolicy | None) -> str | None:
    if value is None:
        return None
    if callbacks is None:
        raise InvalidRequest("callback_url", "is not taken here")
    try:
        return callbacks.check(value)
    except CallbackRefused as refusal:
        raise InvalidRequest("callback_url", str(refusal)) from None


def _choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value.lower() not in choices:
        raise InvalidRequest(name, f"must be one of {', '.join(choices)}")
    return value.lower()


def _boolean(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    raise InvalidRequest(name, "must be true or false")


def as_integer(value: Any) -> int | None:
    """The integer a loosely typed value is, as JSON Schema's ``integer`` counts: 3, or 3.0 (a JSON
    encoder may write any number so); None for anything else, booleans among them."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _integer(value: Any, name: str, low: int, high: int) -> int:
    integer = as_integer(value)
    if integer is None:
        raise InvalidRequest(name, f"must be an integer between {low} and {high}")
    if not low <= integer <= high:
        raise InvalidRequest(name, f"must be between {low} and {high}, got {integer}")
    return integer


def _number(value: Any, name: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequest(name, f"must be a number between {low} and {high}")
    if not low <= value <= high:
        raise InvalidRequest(name, f"must be between {low} and {high}, got {value}")
    return float(value)
