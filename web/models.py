"""The web app's database: the voice catalog and the durable job list (SQLAlchemy 2.0 models)."""

from __future__ import annotations

from datetime import UTC, datetime

from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    TypeDecorator,
    case,
    event,
    false,
)
from sqlalchemy.engine import Engine
from sqlalchemy.ext.hybrid import hybrid_property
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


class UtcDateTime(TypeDecorator):
    """A moment, stored in UTC and read back as an aware UTC datetime on every database: SQLite keeps
    no zone (its values come back naive), PostgreSQL's ``timestamptz`` comes back in the session's zone
    (and a job's day, which its quota counts, must not depend on the server's clock setting)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        return None if value is None else _as_utc(value)

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        return None if value is None else _as_utc(value)


def _as_utc(moment: datetime) -> datetime:
    """The farm writes only UTC: a moment without a zone is one in UTC."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)


def utcnow() -> datetime:
    return datetime.now(UTC)


@event.listens_for(Engine, "connect")
def _configure_sqlite(connection, _record) -> None:
    """WAL lets status pages read while a request writes; the busy timeout makes writers queue, not fail."""
    if type(connection).__module__.startswith("sqlite3"):
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=5000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()


voice_tags = Table(
    "voice_tags",
    Base.metadata,
    Column("voice_id", ForeignKey("voices.id", ondelete="CASCADE"), primary_key=True),
    Column("tag_id", ForeignKey("tags.id", ondelete="CASCADE"), primary_key=True),
)


class Tag(db.Model):
    __tablename__ = "tags"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)  # always lower-case


class VoiceKind:
    """What a catalog voice is made of, derived from its fields (:attr:`Voice.kind`)."""

    SEED = "seed"  # a seed, and the embedding a worker drew from it
    EMBEDDING = "embedding"  # a speaker-embedding string alone
    CLIP = "clip"  # a reference clip's speaker sample (Voice.spk_smp) and its transcript (Voice.txt_smp)
    BLEND = "blend"  # a weighted mix of other voices (Voice.mix), and the embedding a worker mixed
    ALL = (SEED, EMBEDDING, CLIP, BLEND)


class Voice(db.Model):
    __tablename__ = "voices"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    # Seeds go up to 2**32 - 1: past PostgreSQL's 32-bit integer.
    seed: Mapped[int | None] = mapped_column(BigInteger)
    # Stored for every voice but one from a reference clip: the embedding, not the seed, is the voice on
    # any model build and device.
    spk_emb: Mapped[str | None] = mapped_column(Text)
    # A voice from a reference clip: ChatTTS's speaker sample of the clip (the DVAE encoder's codes, made
    # by a worker) and the clip's words, which every prompt in this voice carries.
    spk_smp: Mapped[str | None] = mapped_column(Text)
    txt_smp: Mapped[str | None] = mapped_column(Text)
    description: Mapped[str] = mapped_column(Text, default="")
    gender: Mapped[str | None] = mapped_column(String(20))
    age: Mapped[str | None] = mapped_column(String(20))
    rating: Mapped[int] = mapped_column(Integer, default=0)
    favourite: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, onupdate=utcnow)
    tags: Mapped[list[Tag]] = relationship(secondary=voice_tags, order_by=Tag.name)
    # The key that made the voice, when keys are on. None for voices made with keys off or before
    # voices had owners: with keys on, only admin keys may change those.
    owner_key_id: Mapped[int | None] = mapped_column(ForeignKey("api_keys.id", ondelete="SET NULL"))
    owner: Mapped[ApiKey | None] = relationship()
    # A blend's parts as mixed: [{"voice": seed or embedding, "weight", "voice_id"?}, ...], voice_id naming
    # the catalog voice a part was (its embedding is the part's voice). None for every other kind: SQL's
    # NULL, not JSON's null, so that the kind can be asked of the database.
    mix: Mapped[list[dict] | None] = mapped_column(JSON(none_as_null=True))

    @hybrid_property
    def kind(self) -> str:
        if self.spk_smp is not None:
            return VoiceKind.CLIP
        if self.mix is not None:
            return VoiceKind.BLEND
        return VoiceKind.SEED if self.seed is not None else VoiceKind.EMBEDDING

    @kind.inplace.expression
    @classmethod
    def _kind_in_sql(cls):
        return case(
            (cls.spk_smp.is_not(None), VoiceKind.CLIP),
            (cls.mix.is_not(None), VoiceKind.BLEND),
            (cls.seed.is_not(None), VoiceKind.SEED),
            else_=VoiceKind.EMBEDDING,
        )

    def may_be_changed_by(self, api_key: ApiKey | None) -> bool:
        """Every key may read and speak a voice; only its owner or an admin key may change or delete it.
        With keys off (no key) anyone may."""
        return api_key is None or api_key.is_admin or self.owner_key_id == api_key.id


class ApiKey(db.Model):
    """An API key. Only its SHA-256 is stored: keys are 256-bit random, so a fast hash suffices."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(12))  # shown in listings to tell keys apart
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # An admin key may change and delete every catalog voice, not only the ones it made.
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


# A batch item's custom_id names its audio in the batch's archive: letters, digits, "_", "-" and ".".
CUSTOM_ID_MAX_CHARS = 100


class JobStatus:
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    FINISHED = (DONE, FAILED, CANCELLED)
    ALL = (QUEUED, RUNNING, DONE, FAILED, CANCELLED)


class CallbackState:
    """How far a finished job's callback got (the web's side; the worker's attempts add retrying)."""

    PENDING = "pending"  # the job has ended; its delivery is not yet in the queue
    QUEUED = "queued"  # its delivery is in the workers' hands: their record says how it goes
    DELIVERED = "delivered"
    FAILED = "failed"
    OVER = (DELIVERED, FAILED)


class CallsBack:
    """A row whose status is POSTed to its ``callback_url`` when it ends (a job, a batch; see
    web.callbacks), and how far that got: None until it ends, then CallbackState's; the attempts
    (worker.callbacks' records) once its delivery is over."""

    callback_url: Mapped[str | None] = mapped_column(Text)
    callback_state: Mapped[str | None] = mapped_column(String(16), index=True)
    callback_attempts: Mapped[list | None] = mapped_column(JSON)


class BatchStatus:
    RUNNING = "running"  # some of its items have not ended
    DONE = "done"  # every item has ended (done, failed, or cancelled one by one)
    CANCELLED = "cancelled"  # cancelled as a whole; every item has ended
    ALL = (RUNNING, DONE, CANCELLED)


class Batch(CallsBack, db.Model):
    """Jobs submitted together, all or none (``POST /api/batches``): its items are the jobs whose
    ``batch_id`` it is, in the order given (``Job.batch_item``)."""

    __tablename__ = "batches"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)
    size: Mapped[int] = mapped_column(Integer)
    # The key that submitted it, when keys are on: only it may read or cancel the batch.
    api_key_id: Mapped[int | None] = mapped_column(ForeignKey("api_keys.id", ondelete="SET NULL"))
    # When the farm noticed that its last item had ended; set once, by the request that noticed.
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    cancelled_at: Mapped[datetime | None] = mapped_column(UtcDateTime)

    @property
    def status(self) -> str:
        if self.finished_at is None:
            return BatchStatus.RUNNING
        return BatchStatus.CANCELLED if self.cancelled_at is not None else BatchStatus.DONE


class Job(CallsBack, db.Model):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)  # the Celery task id
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)
    text: Mapped[str] = mapped_column(Text)
    # Indexed: a voice's previews are looked up by it, and deleting a voice updates its jobs.
    voice_id: Mapped[int | None] = mapped_column(ForeignKey("voices.id", ondelete="SET NULL"), index=True)
    voice_seed: Mapped[int | None] = mapped_column(BigInteger)
    voice_embedding: Mapped[str | None] = mapped_column(Text)
    # A blend's parts as sent ({"mix": [...]}, seeds and embeddings); its embedding, once a worker has
    # mixed it, is voice_embedding.
    voice_mix: Mapped[dict | None] = mapped_column(JSON)
    # A voice from a reference clip, as sent ({"spk_smp": ..., "txt_smp": ...}).
    voice_sample: Mapped[dict | None] = mapped_column(JSON)
    parameters: Mapped[dict] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.QUEUED, index=True)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[str | None] = mapped_column(Text)
    duration_s: Mapped[float | None] = mapped_column(Float)
    format: Mapped[str] = mapped_column(String(8))
    audio_key: Mapped[str | None] = mapped_column(String(100))
    result: Mapped[dict | None] = mapped_column(JSON)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)

    # The key that submitted the job, when keys are on: only it may read the job and its audio.
    api_key_id: Mapped[int | None] = mapped_column(ForeignKey("api_keys.id", ondelete="SET NULL"))
    # A voice's preview: kept and given again to the same key (or, with keys off, to anyone) while its
    # audio lives, so each voice is previewed once per key.
    is_preview: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())

    # An item of a batch: its batch (its rows go with the batch's), its place in it from 0, and the id
    # its caller gave it. Indexed with the status: a batch's unfinished items are looked up as each ends.
    batch_id: Mapped[str | None] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"))
    batch_item: Mapped[int | None] = mapped_column(Integer)
    custom_id: Mapped[str | None] = mapped_column(String(CUSTOM_ID_MAX_CHARS))

    voice: Mapped[Voice | None] = relationship()

    __table_args__ = (Index("ix_jobs_batch_id_status", "batch_id", "status"),)
