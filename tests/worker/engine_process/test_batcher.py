"""The batcher drives the synthesizer: jobs join as they come, and failures are isolated.

Faults are injected into the real (synthetic-tiny) engine's step: a poison input and a CUDA
out-of-memory error cannot be produced on demand by the real model on a CPU.
"""

import dataclasses
import time

import numpy as np
import pytest
import torch

from chattts_farm.contract import JobCancelled, SynthesisFailed, SynthesisRequest
from tests.worker.engine.test_device_waits import Event
from worker.engine import device_waits
from worker.engine_process.batcher import Batcher
from worker.engine_process.pipeline import Synthesizer


@pytest.fixture
def core(tiny_settings, synthesizer):
    """A synthesizer of its own (the engine's slots are per synthesizer) on the session's model."""
    return Synthesizer(synthesizer.model, tiny_settings)


def failing_engine(core, monkeypatch, fails):
    """Make the engine's step raise ``fails(segments in the engine)`` when that is not None."""
    engine = core.engine
    real_step = engine.step

    def step():
        error = fails([*engine.scheduler.waiting, *engine.scheduler.running.values()])
        if error is not None:
            raise error
        return real_step()

    monkeypatch.setattr(engine, "step", step)


def started_batcher(core, is_revoked=lambda job_id: False):
    batcher = Batcher(core, soft_limit_s=60, hard_limit_s=120, is_revoked=is_revoked)
    batcher.start()
    return batcher


def outcomes_of(handles, timeout=120):
    for handle in handles:
        assert handle.finished.wait(timeout), handle.request.request_id
    return [handle.outcome for handle in handles]


TEXTS = ["First mate.", "Second mate.", "POISON pill.", "Third mate.", "Fourth mate."]


def test_a_poison_job_fails_alone_with_a_reason_and_its_batch_mates_complete(core, monkeypatch):
    failing_engine(
        core,
        monkeypatch,
        lambda segments: RuntimeError("segfault-like crash") if any("POISON" in s.text for s in segments) else None,
    )
    calls = []
    real_synthesize = core.synthesize
    monkeypatch.setattr(
        core, "synthesize", lambda requests, **kw: calls.append(len(requests)) or real_synthesize(requests, **kw)
    )
    batcher = Batcher(core, soft_limit_s=60, hard_limit_s=120, is_revoked=lambda job_id: False)
    handles = [batcher.submit(SynthesisRequest(text=text, request_id=f"job-{i}")) for i, text in enumerate(TEXTS)]
    batcher.start()
    outcomes = outcomes_of(handles)
    assert isinstance(outcomes[2], SynthesisFailed) and "segfault-like crash" in str(outcomes[2])
    assert all(not isinstance(o, Exception) and o.duration_s > 0 for i, o in enumerate(outcomes) if i != 2)
    assert len(calls) <= 2 * 3  # bounded: at most log2(n) levels of splitting


def test_a_streaming_job_whose_step_fails_streams_on_from_where_it_was_without_repeating_audio(core, monkeypatch):
    chunks = []
    failed = []

    def fails(segments):
        if chunks and not failed:  # once, after the stream has begun
            failed.append(True)
            return RuntimeError("transient crash")
        return None

    failing_engine(core, monkeypatch, fails)
    batcher = started_batcher(core)
    request = SynthesisRequest(text=" ".join(TEXTS) * 3, request_id="streamed", seed=11)
    streamed = batcher.submit(request, on_audio=lambda segment, samples: chunks.append(samples))
    mate = batcher.submit(SynthesisRequest(text="A batch mate.", request_id="mate"))
    result, mate_result = outcomes_of([streamed, mate])
    assert failed and not isinstance(result, Exception) and not isinstance(mate_result, Exception)
    assert result.pieces is None  # its audio went out as it was drawn
    (plain,) = outcomes_of([batcher.submit(dataclasses.replace(request, request_id="plain"))])
    joined = np.concatenate(chunks)
    assert joined.shape == plain.samples.shape  # nothing went out twice, nothing is missing
    assert np.abs(joined - plain.samples).max() < 1e-4


def test_a_job_whose_audio_fails_to_decode_fails_alone_and_its_batch_mates_complete(core, monkeypatch):
    real_submit = core.decoder.submit

    def submit(pieces):
        if any("POISON" in piece.segment.text for piece in pieces):
            raise RuntimeError("vocoder crash")
        return real_submit(pieces)

    monkeypatch.setattr(core.decoder, "submit", submit)
    batcher = started_batcher(core)
    handles = [batcher.submit(SynthesisRequest(text=text, request_id=f"job-{i}")) for i, text in enumerate(TEXTS)]
    outcomes = outcomes_of(handles)
    assert isinstance(outcomes[2], SynthesisFailed) and "vocoder crash" in str(outcomes[2])
    assert all(not isinstance(o, Exception) and o.duration_s > 0 for i, o in enumerate(outcomes) if i != 2)


def test_an_out_of_memory_step_is_split_until_it_fits_and_every_job_completes(core, monkeypatch):
    failing_engine(
        core,
        monkeypatch,
        lambda segments: (
            torch.cuda.OutOfMemoryError("CUDA out of memory") if len({s.owner for s in segments}) > 2 else None
        ),
    )
    batcher = Batcher(core, soft_limit_s=60, hard_limit_s=120, is_revoked=lambda job_id: False)
    handles = [batcher.submit(SynthesisRequest(text=text, request_id=f"job-{i}")) for i, text in enumerate(TEXTS)]
    batcher.start()
    assert all(not isinstance(o, Exception) for o in outcomes_of(handles))


def test_a_job_that_arrives_while_others_run_joins_them_and_finishes_first(core):
    batcher = started_batcher(core)
    long_one = batcher.submit(SynthesisRequest(text="A long job that keeps the engine busy. " * 6, request_id="long"))
    while core.engine.running == 0:
        time.sleep(0.01)
    short_one = batcher.submit(SynthesisRequest(text="Short.", request_id="short"))
    assert short_one.finished.wait(120)
    assert not long_one.finished.is_set()  # no head-of-line blocking behind the long job
    assert short_one.outcome.batch_size == 2
    assert not isinstance(outcomes_of([long_one])[0], Exception)


def test_the_engine_threads_time_in_steps_and_its_waits_for_the_device_within_it_are_counted(core, monkeypatch):
    engine, real_step, steps = core.engine, core.engine.step, []

    def step():
        steps.append(1)
        device_waits.wait_for(Event(0.02))  # as the runner waits for a step's state on a GPU
        return real_step()

    monkeypatch.setattr(engine, "step", step)
    batcher = started_batcher(core)
    outcomes_of([batcher.submit(SynthesisRequest(text=f"Counted {n}.", request_id=str(n))) for n in range(2)])
    assert steps
    stats = batcher.stats
    assert 0.02 * len(steps) <= stats.waiting_for_device_s < stats.in_steps_s  # the rest is the host's work


def test_a_revoked_job_ends_at_once_and_its_batch_mates_go_on(core):
    revoked = set()
    batcher = started_batcher(core, is_revoked=lambda job_id: job_id in revoked)
    doomed = batcher.submit(SynthesisRequest(text="Revoke me, I am long. " * 10, request_id="doomed"))
    mate = batcher.submit(SynthesisRequest(text="I stay, and I am long too. " * 10, request_id="mate"))
    while core.engine.running == 0:
        time.sleep(0.01)
    revoked.add("doomed")
    assert doomed.finished.wait(30) and isinstance(doomed.outcome, JobCancelled)
    assert not mate.finished.is_set()
    assert not isinstance(outcomes_of([mate])[0], Exception)


def test_segments_beyond_the_slots_wait_and_every_job_completes(tiny_settings, synthesizer):
    small = Synthesizer(synthesizer.model, dataclasses.replace(tiny_settings, slots=2))
    batcher = started_batcher(small)
    handles = [batcher.submit(SynthesisRequest(text=f"Job number {i}.", request_id=f"job-{i}")) for i in range(6)]
    assert all(not isinstance(o, Exception) for o in outcomes_of(handles))
    assert small.engine.runner.slots == 2
