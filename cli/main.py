"""The ``chattts-farm`` command line."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
import sys
import tempfile
from pathlib import Path

import click

from chattts_farm.contract import FORMATS, FarmError, SynthesisRequest
from chattts_farm.settings import Settings, SettingsError
from cli.settings_docs import EXAMPLE_PASSWORD
from worker.cuda import configure_allocator

logger = logging.getLogger(__name__)


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# How often `batch` reads its batch's progress.
BATCH_POLL_S = 2


def _log_to_stderr(level: str = "INFO") -> None:
    """Log lines for the long-running commands (workers, up, reconcile), all in one format."""
    logging.basicConfig(level=level, format=LOG_FORMAT)


def _settings(**overrides: object) -> Settings:
    try:
        return Settings.from_env(**overrides)
    except SettingsError as error:
        raise click.UsageError(str(error)) from None


class _ProgressBar:
    """A terminal progress bar for long work (asset builds, a long text's synthesis), fed (step, done, total)
    calls; silent when stderr is not a terminal, so logs and pipes get no carriage-return litter."""

    def __init__(self, description: str, unit: str = "file") -> None:
        self.description = description
        self.unit = unit
        self.bar = None

    def __call__(self, step: str, done: float, total: int) -> None:
        from tqdm import tqdm

        if self.bar is None:
            self.bar = tqdm(total=total, desc=self.description, unit=self.unit, file=sys.stderr, disable=None)
        self.bar.set_postfix_str(step, refresh=False)
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _segment_progress(bar: _ProgressBar):
    """Feeds a bar counted in segments from the synthesizer's (request, fraction, done, total) reports."""

    def report(_request: int, fraction: float, done: int, total: int) -> None:
        bar(f"{done}/{total} segments", round(fraction * total, 2), total)

    return report


@click.group()
def main() -> None:
    """chattts-farm: a ChatTTS speech-synthesis farm."""
    # Before any command can make torch touch the GPU.
    configure_allocator()


@main.command()
@click.argument("text")
@click.option("--voice", default="2222", show_default=True, help="A seed or a speaker-embedding string.")
@click.option("--format", "audio_format", type=click.Choice(FORMATS), default="wav", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--seed", type=int, default=None, help="Audio sampling seed (default: random, printed).")
@click.option("--speed", type=int, default=5, show_default=True, help="ChatTTS speed 1..9.")
@click.option("--temperature", type=float, default=0.3, show_default=True)
@click.option("--top-p", type=float, default=0.7, show_default=True)
@click.option("--top-k", type=int, default=20, show_default=True)
@click.option("--refine-text/--no-refine-text", default=False, show_default=True)
@click.option("--model", default=None, help="Model source (default: CHATTTS_FARM_MODEL or huggingface).")
def say(
    text: str,
    voice: str,
    audio_format: str,
    output: Path,
    seed: int | None,
    speed: int,
    temperature: float,
    top_p: float,
    top_k: int,
    refine_text: bool,
    model: str | None,
) -> None:
    """Synthesise TEXT into a file, locally, without the farm."""
    from worker.engine_process.pipeline import Synthesizer

    settings = _settings(model=model)
    try:
        request = SynthesisRequest.from_arguments(
            {
                "text": text,
                "voice": voice,
                "format": audio_format,
                "seed": seed,
                "speed": speed,
                "temperature": temperature,
                "top_p": top_p,
                "top_k": top_k,
                "refine_text": refine_text,
            },
            max_text_chars=settings.max_text_chars,
        )
        progress = _ProgressBar("preparing the model")
        synthesizer = Synthesizer.load(settings, progress=progress)
        progress.close()
        speaking = _ProgressBar("speaking", unit="segment")
        outcome = synthesizer.synthesize([request], on_progress=_segment_progress(speaking))[0]
        speaking.close()
        if isinstance(outcome, Exception):
            raise outcome
    except FarmError as error:
        raise click.ClickException(str(error)) from None
    output.write_bytes(outcome.audio)
    summary = outcome.summary()
    del summary["voice_embedding"]
    click.echo(json.dumps({"output": str(output), **summary}, indent=2))


@main.command()
@click.argument("items", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--url", envvar="CHATTTS_FARM_URL", default="http://127.0.0.1:8000", show_default=True, help="The farm's web."
)
@click.option("--api-key", envvar="CHATTTS_FARM_API_KEY", default=None, help="The key, where the farm requires one.")
@click.option("--voice", default=None, help="The voice of every item that names none.")
@click.option(
    "--format", "audio_format", type=click.Choice(FORMATS), default=None, help="Every item's, unless it says."
)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None, help="The archive (ITEMS.zip)."
)
def batch(items: Path, url: str, api_key: str | None, voice: str | None, audio_format: str | None, output: Path | None):
    """Submit ITEMS, a JSON Lines file (one job's fields a line, with an optional custom_id), as one batch;
    show its progress; write the zip of its audio (and manifest.json) when every item has ended. Exits 1
    when an item failed or was cancelled (the archive is written all the same)."""
    import time

    from cli.batch_client import BatchRefused, Farm

    farm = Farm(url.rstrip("/") + "/", api_key)
    defaults = {"voice": voice, "format": audio_format}
    try:
        status = farm.submit(items, {name: value for name, value in defaults.items() if value is not None})
        click.echo(f"batch {status['id']}: {status['size']} items", err=True)
        try:
            with click.progressbar(length=status["size"], label="speaking", file=sys.stderr) as bar:
                while True:
                    ended = status["size"] - status["counts"]["queued"] - status["counts"]["running"]
                    bar.update(ended - bar.pos)
                    if status["status"] != "running":
                        break
                    time.sleep(BATCH_POLL_S)
                    status = farm.status(status["status_url"] + "?items=none")
        except KeyboardInterrupt:
            raise click.ClickException(
                f"stopped watching; batch {status['id']} goes on (cancel it: DELETE {url}{status['status_url']})"
            ) from None
        output = output or items.with_suffix(".zip")
        farm.download(status["archive_url"], output)
    except BatchRefused as refusal:
        raise click.ClickException(str(refusal)) from None
    counts = ", ".join(f"{count} {name}" for name, count in status["counts"].items() if count)
    click.echo(f"batch {status['id']} {status['status']}: {counts}; archive {output}")
    if status["counts"]["done"] != status["size"]:
        sys.exit(1)


@main.group()
def assets() -> None:
    """Synthetic ChatTTS assets (random weights in ChatTTS's layout)."""


@assets.command("prepare")
@click.argument("scale", type=click.Choice(["tiny", "full"]))
def assets_prepare(scale: str) -> None:
    """Build synthetic assets of SCALE in the data dir's cache, unless they are already there."""
    from worker.model.synthetic_assets import ensure_synthetic_assets

    progress = _ProgressBar(f"building synthetic-{scale} assets")
    root = ensure_synthetic_assets(_settings().data_dir, scale, progress=progress)
    progress.close()
    click.echo(f"synthetic-{scale} assets ready in {root}")


@assets.command("build")
@click.option("--scale", type=click.Choice(["tiny", "full"]), required=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def assets_build(scale: str, seed: int, directory: Path) -> None:
    """Build synthetic assets of SCALE into DIRECTORY."""
    from worker.model.synthetic_assets import build_synthetic_assets

    progress = _ProgressBar(f"building synthetic-{scale} assets")
    manifest = build_synthetic_assets(directory, scale, seed=seed, progress=progress)
    progress.close()
    click.echo(f"built synthetic-{manifest.scale} assets (seed {manifest.seed}) in {directory}")


@main.command()
@click.option("--gpus", default=None, help="GPU indices (0,1,...) or 'all' (the default).")
@click.option("--cpu", "cpu_workers", type=int, default=None, help="Run N CPU workers instead of GPU workers.")
@click.option("--loglevel", default="INFO", show_default=True)
def worker(gpus: str | None, cpu_workers: int | None, loglevel: str) -> None:
    """Run one Celery worker process per GPU (or N CPU workers), restarting any that dies."""
    from worker.supervisor import NoGpus, Supervisor, plan_workers

    _log_to_stderr(loglevel)
    settings = _settings()
    # The engines' sockets, where a GPU's other Celery processes reach its engine: a directory only this
    # user may enter.
    with tempfile.TemporaryDirectory(prefix="chattts-farm-engines-") as socket_dir:
        try:
            specs = plan_workers(gpus, cpu_workers, celery_processes=settings.celery_processes, socket_dir=socket_dir)
        except (NoGpus, ValueError) as error:
            raise click.UsageError(str(error)) from None
        code = Supervisor(specs, settings, loglevel).run()
    sys.exit(code)


@main.group()
def db() -> None:
    """The web app's database schema (Alembic migrations in migrations/)."""


@db.command("upgrade")
@click.argument("revision", default="head")
def db_upgrade(revision: str) -> None:
    """Apply migrations up to REVISION (default: the newest)."""
    _migrate("upgrade", revision)
    click.echo(f"database at {revision}: {_shown_database()}")


@db.command("downgrade")
@click.argument("revision", default="-1")
def db_downgrade(revision: str) -> None:
    """Undo migrations down to REVISION (default: one step; 'base' empties the schema)."""
    _migrate("downgrade", revision)
    click.echo(f"database downgraded to {revision}: {_shown_database()}")


def _shown_database() -> str:
    """The database's URL without its password (the output may go to a log)."""
    from sqlalchemy.engine import make_url

    return make_url(_settings().database_uri).render_as_string(hide_password=True)


def _migrate(direction: str, revision: str) -> None:
    import flask_migrate

    from web import create_app

    with create_app().app_context():
        getattr(flask_migrate, direction)(revision=revision)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--workers", type=int, default=2, show_default=True, help="gunicorn worker processes.")
def web(host: str, port: int, workers: int) -> None:
    """Serve the web app with gunicorn, after applying pending database migrations."""
    import shutil

    _migrate("upgrade", "head")
    gunicorn = shutil.which("gunicorn", path=os.path.dirname(sys.executable)) or shutil.which("gunicorn")
    if gunicorn is None:
        raise click.ClickException("gunicorn is not installed: pip install 'chattts-farm[web]'")
    settings = _settings()
    # gevent: a request waiting on its job (/v1/audio/speech) is a parked greenlet, not a thread, so
    # thousands of them leave the process free to answer everyone else (see web.waiting). Its worker
    # class here answers gunicorn's own refusals (414, 431) in JSON, as the app answers the rest.
    os.execv(
        gunicorn,
        [
            gunicorn,
            "--bind",
            f"{host}:{port}",
            "--workers",
            str(workers),
            "--worker-class",
            "web.gunicorn_worker.JsonErrorsGeventWorker",
            "--worker-connections",
            str(settings.web_connections),
            # gunicornc's socket, one per farm and port: gunicorn's default is one per user
            # (~/.gunicorn/gunicorn.ctl), which each new web of that user takes from the one before.
            "--control-socket",
            str(settings.data_dir.resolve() / f"gunicorn-{port}.ctl"),
            "--access-logfile",
            "-",
            "web:create_app()",
        ],
    )


@main.command()
@click.option("--address", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=5555, show_default=True)
def flower(address: str, port: int) -> None:
    """Run Flower on the farm's broker, behind basic auth from CHATTTS_FARM_FLOWER_AUTH=user:password."""
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "worker.celery_app",
        "flower",
        f"--address={address}",
        f"--port={port}",
    ]
    auth = _settings().flower_auth
    if auth:
        user, _, password = auth.partition(":")
        if not user or not password:
            raise click.UsageError("CHATTTS_FARM_FLOWER_AUTH must be user:password")
        if password == EXAMPLE_PASSWORD:
            raise click.UsageError(
                f"CHATTTS_FARM_FLOWER_AUTH still has the example password {EXAMPLE_PASSWORD!r}: choose your own"
            )
        command.append(f"--basic-auth={auth}")
    elif ipaddress.ip_address(socket.gethostbyname(address)).is_loopback:
        click.echo("warning: CHATTTS_FARM_FLOWER_AUTH is not set: Flower runs without authentication", err=True)
    else:
        # Flower can revoke jobs and shut workers down: never open beyond this machine.
        raise click.UsageError(f"Flower on {address} needs CHATTTS_FARM_FLOWER_AUTH=user:password")
    os.execv(sys.executable, command)


@main.command()
@click.option("--model", envvar="CHATTTS_FARM_MODEL", default="auto", show_default=True)
@click.option("--host", envvar="CHATTTS_FARM_HOST", default="127.0.0.1", show_default=True)
@click.option("--port", envvar="CHATTTS_FARM_PORT", type=int, default=8000, show_default=True)
@click.option("--flower-port", envvar="CHATTTS_FARM_FLOWER_PORT", type=int, default=5555, show_default=True)
@click.option(
    "--redis-url", envvar="CHATTTS_FARM_REDIS_URL", default=None, help="Use this Redis instead of starting one."
)
@click.option(
    "--redis-port",
    envvar="CHATTTS_FARM_REDIS_PORT",
    type=int,
    default=6379,
    show_default=True,
    help="Port of the Redis that up starts.",
)
@click.option(
    "--data-dir",
    envvar="CHATTTS_FARM_DATA_DIR",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("var"),
    show_default=True,
)
@click.option("--gpus", envvar="CHATTTS_FARM_GPUS", default=None, help="GPU indices or 'all' (default: all).")
@click.option(
    "--cpu-workers",
    envvar="CHATTTS_FARM_CPU_WORKERS",
    type=int,
    default=None,
    help="CPU workers instead of GPU workers (default: 1 where there is no GPU).",
)
def up(
    model: str,
    host: str,
    port: int,
    flower_port: int,
    redis_url: str | None,
    redis_port: int,
    data_dir: Path,
    gpus: str | None,
    cpu_workers: int | None,
) -> None:
    """Run the whole farm here: Redis, migrations, workers, web app, Flower and the reconciler; a part
    that dies is started again."""
    from cli.launcher import Launcher, LaunchError, LaunchPlan

    _log_to_stderr()
    plan = LaunchPlan(model, host, port, flower_port, redis_url, redis_port, data_dir, gpus, cpu_workers)
    try:
        sys.exit(Launcher(plan).run())
    except LaunchError as error:
        raise click.ClickException(str(error)) from None


@main.group()
def keys() -> None:
    """API keys (required on the API when CHATTTS_FARM_REQUIRE_API_KEY is on)."""


@keys.command("create")
@click.argument("name")
@click.option("--admin", is_flag=True, help="The key may change and delete every catalog voice, not only its own.")
def keys_create(name: str, admin: bool) -> None:
    """Create a key for NAME and print it (it is shown this once; only its hash is kept)."""
    from sqlalchemy.exc import IntegrityError

    from web import create_app
    from web.access import api_keys

    with create_app().app_context():
        try:
            click.echo(api_keys.create_key(name, admin=admin))
        except IntegrityError:
            raise click.ClickException(f"a key named {name!r} exists already") from None


@keys.command("list")
def keys_list() -> None:
    """List keys: name, prefix, created, active or revoked, admin or standard."""
    from web import create_app
    from web.models import ApiKey, db

    with create_app().app_context():
        for key in db.session.execute(db.select(ApiKey).order_by(ApiKey.name)).scalars():
            state = f"revoked {key.revoked_at:%Y-%m-%d}" if key.revoked_at else "active"
            role = "admin" if key.is_admin else "standard"
            click.echo(f"{key.name}\t{key.prefix}...\t{key.created_at:%Y-%m-%d}\t{state}\t{role}")


@keys.command("revoke")
@click.argument("name")
def keys_revoke(name: str) -> None:
    """Revoke the key of NAME."""
    from web import create_app
    from web.access import api_keys

    with create_app().app_context():
        if not api_keys.revoke_key(name):
            raise click.ClickException(f"no active key named {name!r}")
    click.echo(f"revoked {name}")


@main.command()
@click.option("--loop", is_flag=True, help="Repeat every CHATTTS_FARM_GC_INTERVAL_S seconds (default: once).")
def gc(loop: bool) -> None:
    """Delete audio past CHATTTS_FARM_AUDIO_TTL_S and finished jobs (and ended batches) past
    CHATTTS_FARM_JOB_RETENTION_S."""
    import time

    from web import create_app
    from web.retention import collect

    _log_to_stderr()
    every = _settings().gc_interval_s
    app = create_app()
    while True:
        try:
            with app.app_context():
                collected = collect()
            click.echo(
                f"deleted {collected.audio} audio file(s) and {collected.jobs} finished job(s);"
                f" {collected.batches} ended batch(es)"
            )
        except Exception as error:
            if not loop:
                raise click.ClickException(f"gc failed: {error}") from None
            # A store or database away for a while: what is left is deleted next time.
            logger.warning("gc failed; trying again in %s s: %s", every, error)
        if not loop:
            return
        time.sleep(every)


@main.command()
@click.option("--every", type=float, default=None, help="Repeat every this many seconds (default: once).")
def reconcile(every: float | None) -> None:
    """Enqueue again every unfinished job of the database that Redis has lost."""
    import time

    from kombu.exceptions import OperationalError
    from redis.exceptions import RedisError

    from web import create_app
    from web.reconcile import reconcile as reconcile_once

    _log_to_stderr()
    app = create_app()
    while True:
        try:
            with app.app_context():
                resent = reconcile_once()
            click.echo(f"re-enqueued {len(resent)} lost job(s)" + (f": {', '.join(resent)}" if resent else ""))
        except (RedisError, OperationalError) as error:
            if every is None:
                raise click.ClickException(f"Redis could not be reached: {error}") from None
            # Redis away (restarting, say) is when the reconciler is needed next: keep going.
            logger.warning("Redis could not be reached; trying again in %s s: %s", every, error)
        if every is None:
            return
        time.sleep(every)
