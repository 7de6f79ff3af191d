"""The engine process's entry: the model, the engine and the batcher of one GPU, on an interpreter of their own.

Started and watched by the worker's Celery side (see worker.engine_client) as
``python -m worker.engine_process.main <fd> <name> <log level>``, where ``fd`` is its end of the channel (see
worker.channel). It loads and warms up the model, says ``ready``, then serves: every ``submit`` goes
to the batcher, whose thread drives the GPU; this process's main thread only reads the channel, and
one sender thread writes to it (all that waits, in one system call a channel), so the engine's thread
never waits on a socket. When the Celery side goes (its end of the channel closes: a worker stopped or
killed), this process ends at once.

Where a GPU has more than one Celery process (``CHATTTS_FARM_CELERY_PROCESSES``: one interpreter's lock
carries only so many jobs a second), the first starts this process and the others connect to the
socket it listens on (``CHATTTS_FARM_ENGINE_SOCKET``): each channel has a reader thread of its own, and
each job's audio, result and progress go back on the channel it came on. Another Celery process that
goes takes its jobs with it (they come back through its queue); the first one going ends this process.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import sys
import threading
import time

import numpy as np
import setproctitle

from chattts_farm.contract import FarmError, SynthesisRequest, parse_voice
from chattts_farm.settings import Settings
from worker.batches import take_all
from worker.channel import Channel, error_fields, float32_bytes, listen
from worker.engine_process.batcher import Batcher, JobHandle
from worker.engine_process.pipeline import PROGRESS_INTERVAL_S, Synthesizer
from worker.engine_report import MemoryGrowth, engine_stats

logger = logging.getLogger(__name__)

# The GPU's memory and utilisation go out with every this many status messages (about every 2 s).
GPU_REPORT_EVERY = 4


class EngineServer:
    def __init__(self, channel: Channel, synthesizer: Synthesizer, settings: Settings):
        self.channel = channel  # the starting Celery process's: when it closes, this process ends
        self.synthesizer = synthesizer
        self.socket_path = settings.engine_socket
        self._lock = threading.Lock()  # over the two maps below: every channel has a reader thread
        self._jobs_of: dict[Channel, set[str]] = {channel: set()}  # submitted, not finished, by channel
        self._cancelled: set[str] = set()  # of those, the ones a Celery process has ended
        self.batcher = Batcher(
            synthesizer,
            soft_limit_s=settings.task_soft_time_limit_s,
            hard_limit_s=settings.task_time_limit_s,
            is_revoked=self._cancelled.__contains__,
        )
        self.max_text_chars = settings.max_text_chars
        self._outbox: queue.SimpleQueue[tuple[Channel, str, dict]] = queue.SimpleQueue()

    def serve(self) -> None:
        """Serve until the starting Celery process goes; never returns."""
        threading.Thread(target=self._send_outbox, name="channel-sender", daemon=True).start()
        self.batcher.start()
        threading.Thread(target=self._report_status, name="status-reporter", daemon=True).start()
        if self.socket_path:
            listener = listen(self.socket_path)
            threading.Thread(target=self._accept, args=(listener,), name="channel-listener", daemon=True).start()
        self._say_ready(self.channel)
        self._read(self.channel)
        logger.info("the worker's end of the channel has closed: the engine process ends")
        os._exit(0)

    def _say_ready(self, channel: Channel) -> None:
        self._send(channel, "ready", model=self.synthesizer.model.info.as_dict(), pid=os.getpid())

    def _accept(self, listener) -> None:
        """Serve each other Celery process of this GPU that connects, on a thread of its own."""
        while True:
            channel = Channel.accept(listener)
            self._say_ready(channel)  # first in its outbox: the status reporter sees the channel only after
            with self._lock:
                self._jobs_of[channel] = set()
            threading.Thread(target=self._serve_other, args=(channel,), name="channel-reader", daemon=True).start()

    def _serve_other(self, channel: Channel) -> None:
        self._read(channel)
        # That Celery process has gone (its jobs come back through its queue): its jobs end here.
        with self._lock:
            orphans = self._jobs_of.pop(channel)
            self._cancelled.update(orphans)
        channel.close()
        logger.info("a Celery process of this engine has gone: %d job(s) of it dropped", len(orphans))

    def _read(self, channel: Channel) -> None:
        """Handle the channel's messages until the Celery process at its other end goes."""
        while True:
            try:
                message = channel.receive()
            except EOFError:
                return
            getattr(self, "_on_" + message.pop("kind"))(channel, **message)

    def _on_submit(
        self, channel: Channel, job: str, arguments: dict, stream: bool, started_at, started_wall, sent_samples: int
    ):
        try:
            request = SynthesisRequest.from_arguments(arguments, max_text_chars=self.max_text_chars, request_id=job)
        except FarmError as error:  # the Celery side checked it by the same rules: not expected
            self._send(channel, "finished", job=job, started_at=None, started_wall=None, error=error_fields(error))
            return
        with self._lock:
            self._jobs_of[channel].add(job)
            self._cancelled.discard(job)
        self.batcher.submit(
            request,
            on_audio=(lambda segment, samples: self._send_audio(channel, job, segment, samples)) if stream else None,
            on_finished=lambda handle: self._finished(channel, handle),
            started_at=started_at,
            started_wall=started_wall,
            sent_samples=sent_samples,
        )

    def _on_cancel(self, channel: Channel, job: str) -> None:
        with self._lock:
            if job in self._jobs_of.get(channel, ()):  # else it has finished, and its id would stay for good
                self._cancelled.add(job)

    def _on_ask(self, channel: Channel, ask: int, question: str, argument) -> None:
        """Answer a question about voices from the model: a voice's ``embedding``, or a clip's
        ``speaker_sample`` (its samples as :data:`chattts_farm.contract.CLIP_PCM` says)."""
        from worker.engine_process import voices

        chat = self.synthesizer.model.chat
        try:
            if question == "embedding":
                value = voices.embedding_of(chat.speaker, parse_voice(argument))
            elif question == "speaker_sample":
                value = voices.speaker_sample(chat, argument)
            else:
                raise ValueError(f"no such question: {question!r}")
            self._send(channel, "answer", ask=ask, value=value)
        except Exception as error:  # noqa: BLE001 - the asker gets it
            self._send(channel, "answer", ask=ask, error=error_fields(error))

    def _send_audio(self, channel: Channel, job: str, segment: int, samples: np.ndarray) -> None:
        self._send(channel, "audio", job=job, segment=segment, pcm=float32_bytes(samples))

    def _finished(self, channel: Channel, handle: JobHandle) -> None:
        job = handle.request.request_id
        with self._lock:
            self._jobs_of.get(channel, set()).discard(job)
            self._cancelled.discard(job)
        outcome = handle.outcome
        fields = {
            "job": job,
            "started_at": handle.started_at,
            "started_wall": handle.started_wall,
            "first_audio_at": handle.first_audio_at,
        }
        if isinstance(outcome, Exception):
            fields["error"] = error_fields(outcome)
        else:
            fields["result"] = outcome.as_message()
        self._send(channel, "finished", **fields)

    def _report_status(self) -> None:
        """To each Celery process, the progress of its running jobs and the engine's figures, in one
        message every PROGRESS_INTERVAL_S."""
        for count in itertools.count():
            time.sleep(PROGRESS_INTERVAL_S)
            running = {
                handle.request.request_id: [handle.started_at, handle.started_wall, handle.progress]
                for handle in self.batcher.running()
            }
            device = self.synthesizer.model.device
            status = {"stats": engine_stats(self.batcher.stats, self.synthesizer.gates, memory_growth(device))}
            if count % GPU_REPORT_EVERY == 0:
                status["gpu"] = gpu_report(device)
            with self._lock:
                jobs_of = {channel: list(jobs) for channel, jobs in self._jobs_of.items()}
            for channel, jobs in jobs_of.items():
                self._send(channel, "status", jobs={job: running[job] for job in jobs if job in running}, **status)

    def _send(self, channel: Channel, kind: str, **fields) -> None:
        self._outbox.put((channel, kind, fields))

    def _send_outbox(self) -> None:
        while True:
            by_channel: dict[Channel, list[tuple[str, dict]]] = {}
            for channel, kind, fields in take_all(self._outbox):
                by_channel.setdefault(channel, []).append((kind, fields))
            for channel, messages in by_channel.items():
                try:
                    channel.send_all(messages)
                except OSError:
                    if channel is self.channel:
                        logger.info("the worker's end of the channel has closed: the engine process ends")
                        os._exit(0)
                    # another Celery process that has gone: its reader thread drops its jobs


def gpu_report(device) -> dict | None:
    """The GPU's name and memory, and how busy it is; None on a CPU."""
    import torch

    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    allocated = torch.cuda.memory_allocated(device)
    reserved = torch.cuda.memory_reserved(device)
    return {
        "name": torch.cuda.get_device_name(device),
        "memory_total_mb": round(total / 2**20),
        "memory_free_mb": round(free / 2**20),
        "allocated_mb": round(allocated / 2**20, 1),
        "reserved_mb": round(reserved / 2**20, 1),
        "peak_allocated_mb": round(torch.cuda.max_memory_allocated(device) / 2**20, 1),
        "fragmentation": round(1 - allocated / reserved, 4) if reserved else 0.0,
        "utilisation": _utilisation(device),
    }


def memory_growth(device) -> MemoryGrowth:
    """What torch's pinned host memory cache and the device's CUDA allocator have made so far (nothing
    on a CPU, nor before CUDA is initialised: torch's statistics are empty until then)."""
    import torch

    if device.type != "cuda":
        return MemoryGrowth()
    host = torch.cuda.host_memory_stats()
    allocator = torch.cuda.memory_stats(device)
    return MemoryGrowth(
        pinned_blocks_made=host.get("num_host_alloc", 0),
        pinned_alloc_s=host.get("host_alloc_time.total", 0) / 1e6,
        device_blocks_made=allocator.get("num_device_alloc", 0),
        device_alloc_retries=allocator.get("num_alloc_retries", 0),
    )


def _utilisation(device) -> float | None:
    """The GPU's busy fraction over NVML's last sample period; None where NVML cannot be read."""
    import torch

    try:
        return torch.cuda.utilization(device) / 100
    except Exception as error:  # noqa: BLE001 - no NVML library, no driver support, a MIG slice...
        logger.debug("no GPU utilisation: %r", error)
        return None


def main(argv: list[str]) -> None:
    fd, name, log_level = int(argv[0]), argv[1], int(argv[2])
    setproctitle.setproctitle(f"chattts-farm engine {name}")
    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s engine {name} %(name)s: %(message)s")
    # ChatTTS warns about every character its normaliser drops (digits, most symbols): per request,
    # that drowns a worker's log.
    logging.getLogger("ChatTTS").setLevel(logging.ERROR)
    channel = Channel.from_fd(fd)
    try:
        settings = Settings.from_env()
        synthesizer = Synthesizer.load(settings)
    except Exception as error:
        logger.exception("the engine could not start")
        channel.send("failed", error=error_fields(error))
        sys.exit(1)
    EngineServer(channel, synthesizer, settings).serve()


if __name__ == "__main__":
    main(sys.argv[1:])
