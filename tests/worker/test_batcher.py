"""The batcher isolates failures: a poison job fails alone, an out-of-memory batch is split.

The faults are injected by wrapping the real (synthetic-tiny) synthesizer: a poison input and a
CUDA out-of-memory error cannot be produced on demand by the real model on a CPU.
"""

import torch

from chattts_farm.contract import SynthesisFailed, SynthesisRequest
from worker.batcher import Batcher


class FaultySynthesizer:
    """The real synthesizer, failing the way a test asks."""

    def __init__(self, real, fails):
        self.real = real
        self.fails = fails
        self.calls = []

    def synthesize(self, requests, **kwargs):
        self.calls.append(len(requests))
        error = self.fails(requests)
        if error is not None:
            raise error
        return self.real.synthesize(requests, **kwargs)


def run_batch(synthesizer, texts):
    batcher = Batcher(
        synthesizer,
        max_jobs=len(texts),
        window_s=0.0,
        soft_limit_s=60,
        hard_limit_s=120,
        is_revoked=lambda job_id: False,
    )
    jobs = [batcher.submit(SynthesisRequest(text=text, request_id=f"job-{i}")) for i, text in enumerate(texts)]
    batcher._run(jobs)
    assert all(job.finished.is_set() for job in jobs)
    return [job.outcome for job in jobs]


TEXTS = ["First mate.", "Second mate.", "POISON pill.", "Third mate.", "Fourth mate."]


def test_a_poison_job_fails_alone_with_a_reason_and_its_batch_mates_complete(synthesizer):
    poisoned = FaultySynthesizer(
        synthesizer,
        lambda requests: RuntimeError("segfault-like crash") if any("POISON" in r.text for r in requests) else None,
    )
    outcomes = run_batch(poisoned, TEXTS)
    assert isinstance(outcomes[2], SynthesisFailed) and "segfault-like crash" in str(outcomes[2])
    assert all(not isinstance(o, Exception) and o.duration_s > 0 for i, o in enumerate(outcomes) if i != 2)
    assert len(poisoned.calls) <= 1 + 2 * 3  # bounded: at most log2(n) levels of splitting


def test_an_out_of_memory_batch_is_split_until_it_fits_and_every_job_completes(synthesizer):
    too_big = FaultySynthesizer(
        synthesizer, lambda requests: torch.cuda.OutOfMemoryError("CUDA out of memory") if len(requests) > 2 else None
    )
    outcomes = run_batch(too_big, TEXTS)
    assert all(not isinstance(o, Exception) for o in outcomes)
    assert too_big.calls[0] == 5 and max(too_big.calls[1:]) <= 3
