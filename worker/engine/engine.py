"""The engine: segments join and leave the running batch at every step.

``add`` queues segments; each ``step`` gives the running segments the cache blocks of the steps
ahead (preempting the newest when the pool runs dry), admits waiting segments into free slots
(their prompts run as one prefill pass), launches SYNC_EVERY decode steps for every running slot,
and retires the segments that finished with their output, moving the running segments down into the
freed slots when that lets the steps cover fewer rows. Which slots finished is read from a snapshot
of their state (one small device-to-host copy) taken after a step's decode steps; on a GPU the host
reads it while the next step's decode steps run, so that the device never waits for the host's
bookkeeping (a segment leaves one step after it ended, its output copied beside that step). A
segment that arrives while others run starts at the next step; one that ends frees its slot and its
blocks for the next.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

from chattts_farm.contract import InvalidRequest
from worker.engine.blocks import blocks_for
from worker.engine.runner import (
    ENDED_BY_EOS,
    INTERRUPTED,
    ModelRunner,
    StateSnapshot,
    bucket_for,
    to_device,
)
from worker.engine.sampler import RowSampling
from worker.engine.scheduler import Scheduler
from worker.engine.segment import Segment, SegmentOutput
from worker.model.loading import LoadedModel

# Decode steps between two looks of the host at the slots: often enough that a new segment starts
# and a cancelled one stops within a few milliseconds on a GPU, rare enough to keep its queue full.
SYNC_EVERY = 8


class PromptTooLong(InvalidRequest):
    def __init__(self, tokens: int, limit: int):
        super().__init__("text", f"a segment's prompt has {tokens} tokens; the engine takes at most {limit}")


class Engine:
    """``slots`` segments at once over a KV cache of ``kv_blocks`` blocks (default: enough for every
    slot's longest segment, so that nothing is ever preempted)."""

    def __init__(
        self,
        model: LoadedModel,
        *,
        slots: int,
        max_admissions: int,
        max_prompt_tokens: int,
        max_new_tokens: int,
        kv_blocks: int | None = None,
        kv_dtype: torch.dtype | None = None,
        matmul_dtype: torch.dtype | None = None,
        capture_graphs: bool = True,
        prefill_tokens: int | None = None,
    ) -> None:
        self.model = model
        longest = blocks_for(max_prompt_tokens + max_new_tokens)
        kv_blocks = kv_blocks or slots * longest
        if kv_blocks < longest:
            raise ValueError(
                f"a KV cache of {kv_blocks} blocks cannot hold one segment of {max_prompt_tokens} prompt "
                f"and {max_new_tokens} new tokens ({longest} blocks)"
            )
        self.scheduler = Scheduler(slots, max_admissions, kv_blocks)
        self.runner = ModelRunner(
            model,
            slots=slots,
            max_prompt_tokens=max_prompt_tokens,
            max_new_tokens=max_new_tokens,
            max_admissions=max_admissions,
            kv_blocks=kv_blocks,
            kv_dtype=kv_dtype,
            matmul_dtype=matmul_dtype,
            capture_graphs=capture_graphs,
            prefill_tokens=prefill_tokens,
        )
        self.decode_steps = 0
        self.preemptions = 0
        # Per running slot: its prompt's tokens and the decode step it joined at. The host picks each
        # step's attention bucket from these, without asking the device.
        self._joined: dict[int, tuple[int, int]] = {}
        self._deepest_start = 0
        # The slots' state after the last step's decode steps, not read yet; and the decode steps
        # whose results the host has read (what is known drawn).
        self._snapshot: StateSnapshot | None = None
        self._steps_read = 0

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    @property
    def running(self) -> int:
        return len(self.scheduler.running)

    def add(self, segments: Iterable[Segment]) -> None:
        for segment in segments:
            self.scheduler.add(segment)

    def tokens_drawn(self, segment: Segment) -> int:
        """How many steps a running segment is known to have drawn, by the last snapshot read (at most:
        it may have ended since)."""
        if segment.slot is None:
            return 0
        # A snapshot taken after its prefill covers its step 0 and the decode steps since.
        joined = self._joined[segment.slot][1]
        return 1 + self._steps_read - joined if self._steps_read > joined else 0

    @property
    def running_segments(self) -> list[Segment]:
        return list(self.scheduler.running.values())

    def hidden_states(self, segment: Segment, start: int, stop: int) -> torch.Tensor:
        """A copy of a running segment's hidden states of steps [start, stop) (drawn ones: see tokens_drawn);
        called within :meth:`copying_outputs`, it is made beside the steps launched since."""
        return self.runner.copy_hiddens(segment.slot, start, stop)

    def copying_outputs(self):
        """The context in which work on the segments' outputs and hidden states is to be launched: on a
        GPU, a stream that does not wait for the decode steps launched after those outputs were drawn."""
        return self.runner.copying_outputs()

    def cancel(self, should_stop: Callable[[Segment], bool]) -> list[Segment]:
        """Stop matching segments: waiting ones leave now (returned); running ones end at the next step."""
        running = [slot for slot, segment in self.scheduler.running.items() if should_stop(segment)]
        if running:
            self.runner.interrupt(running)
        return self.scheduler.drop_waiting(should_stop)

    def reset(self) -> list[Segment]:
        """Drop every segment (after a failed step); returns them."""
        dropped = self.scheduler.drop_waiting(lambda _: True)
        if self.scheduler.running:
            self.runner.interrupt(list(self.scheduler.running))
        dropped.extend(self._retire(list(self.scheduler.running)))
        self._snapshot = None
        return dropped

    def _demand(self, segment: Segment) -> tuple[int, int]:
        """(start, end) of a segment admitted now: by the time ``c`` decode steps have run, it has filled
        at most ``min(start + c, end)`` cache positions (its prompt's, then one a step)."""
        prompt = len(encode_prompt(self.model, segment))
        # A slot that ends keeps writing at its last position until it is retired.
        return prompt + 1 - self.decode_steps, min(prompt + segment.end_at, self.runner.context)

    def _admit(self) -> list[Segment]:
        """Give the running segments the blocks of this round's decode steps and admit waiting ones;
        returns those admitted (their prefill is still to run, a pass of ``max_admissions`` at a time)."""
        waiting = self.scheduler.waiting
        if waiting and waiting.first().prompt_ids is None:  # a burst: what may be admitted, in one call
            tokenise_prompts(self.model, waiting.next(self.scheduler.most_admitted))
        schedule = self.scheduler.schedule(self.decode_steps + SYNC_EVERY, self._demand, time.monotonic())
        if schedule.preempted:
            # Their slots stop now; the scheduler has put the segments back in the queue.
            slots = [slot for slot, _ in schedule.preempted]
            self.runner.interrupt(slots)
            self._release(slots)
            self.preemptions += len(slots)
        self.runner.set_blocks(schedule.new_blocks)
        return schedule.admitted

    # Without autograd, as the runner captures its graphs (see ModelRunner.capture_every_bucket).
    @torch.no_grad()
    def step(self) -> list[Segment]:
        """Admit, launch SYNC_EVERY decode steps, retire; returns the segments that left the engine.

        A segment leaves with its ``output``, or with ``error`` set when it could not run at all.
        """
        left = []
        if self._snapshot is not None and self._snapshot.ready():
            # The device has run dry: free the finished slots before admitting.
            left.extend(self._take_snapshot())
        for prefill_pass in self._prefill_passes(self._admit()):
            left.extend(self._prefill(prefill_pass))
        launched = bool(self.scheduler.running)
        if launched:
            for _ in range(SYNC_EVERY):
                self._decode_step()
            # The next admissions' prompts are tokenised while the device runs the steps just queued.
            tokenise_prompts(self.model, self.scheduler.waiting.next(self.scheduler.max_admissions))
        if self._snapshot is not None:
            left.extend(self._take_snapshot())
        if launched and self.scheduler.running:
            self._snapshot = self.runner.snapshot_state(self.scheduler.rows_in_use, self.decode_steps)
            if self._snapshot.ready():  # off CUDA the steps have run already
                left.extend(self._take_snapshot())
        return left

    def _prefill_passes(self, admitted: list[Segment]) -> list[list[Segment]]:
        """The admitted segments in prefill passes, in their order of admission, each pass as many as fit
        (:meth:`ModelRunner.prefill_fits`: ``max_admissions`` prompts, the runner's budget of tokens).

        A pass runs its prompts one after another, padded only at its end (to a multiple of 512 tokens
        past 512: worker.engine.runner.prefill_token_buckets), so prompts of any lengths share a pass at
        no cost, and the fewest passes run the fewest tokens. Cut by length into passes of like prompts,
        each padded to (rows, its longest prompt), the standard workload's 1,536 prompts (252k tokens),
        admitted 512 a step, ran 319k tokens in 9 passes; packed, they run 253k in 3 (counted on the CPU
        with synthetic-tiny's tokenizer).
        """
        passes: list[list[Segment]] = []
        tokens = 0
        for segment in admitted:
            length = len(encode_prompt(self.model, segment))
            if passes and self.runner.prefill_fits(len(passes[-1]) + 1, tokens + length):
                passes[-1].append(segment)
                tokens += length
            else:
                passes.append([segment])
                tokens = length
        return passes

    def _take_snapshot(self) -> list[Segment]:
        """Read the last snapshot (waiting for its steps) and retire the segments it shows finished."""
        snapshot, self._snapshot = self._snapshot, None
        finished, lengths, ended_by = self.runner.read_snapshot(snapshot)
        self._steps_read = snapshot.clock
        # A slot whose segment was admitted after the snapshot was taken is not the one it shows.
        retired = [
            slot
            for slot in self.scheduler.running
            if slot < snapshot.rows and finished[slot] and self._joined[slot][1] < snapshot.clock
        ]
        left = []
        segments = self._retire(retired)
        outputs = self.runner.outputs(retired, [lengths[slot] for slot in retired])
        for slot, segment, (hiddens, codes) in zip(retired, segments, outputs, strict=True):
            segment.output = SegmentOutput(
                hiddens=hiddens,
                codes=codes,
                tokens=lengths[slot],
                ended_by=_reason(ended_by[slot], lengths[slot], segment),
            )
            left.append(segment)
        if self._bucket(self.scheduler.rows_in_use) > self._bucket(self.running):
            self._compact()
        return left

    def _bucket(self, rows: int) -> int:
        return bucket_for(self.runner.decode_row_buckets, rows)

    def _compact(self) -> None:
        """Pack the running slots at the front again, so that the steps cover as few rows as the
        running segments need (segments end in any order: late in a workload a few hundred can run
        scattered over the slots of the 1,536 it started with)."""
        moves = self.scheduler.compact()
        self.runner.move_slots(moves)
        for source, target in moves:
            self._joined[target] = self._joined.pop(source)

    def _prefill(self, admitted: list[Segment]) -> list[Segment]:
        device = self.model.device
        limit = self.runner.max_prompt_tokens
        kept, host_lengths, rejected = [], [], []
        for segment in admitted:
            tokens = len(encode_prompt(self.model, segment))
            if tokens > limit:
                segment.error = PromptTooLong(tokens, limit)
                self.runner.clear_blocks([segment.slot])
                self.scheduler.retire(segment.slot)
                rejected.append(segment)
            else:
                kept.append(segment)
                host_lengths.append(tokens)
        admitted = kept
        if not admitted:
            return rejected
        embeddings = _packed_embeddings(self.model, admitted)
        slots = [segment.slot for segment in admitted]
        self.runner.prefill(
            slots,
            embeddings,
            host_lengths,
            row_sampling(admitted, device),
            min_tokens=to_device([segment.pinned_tokens or 0 for segment in admitted], device),
            end_at=to_device([segment.end_at for segment in admitted], device),
        )
        for slot, tokens in zip(slots, host_lengths, strict=True):
            self._joined[slot] = (tokens, self.decode_steps)
        self._deepest_start = self._deepest()
        return rejected

    def _decode_step(self) -> None:
        rows = self._bucket(self.scheduler.rows_in_use)
        columns = self._deepest_start + self.decode_steps
        self.runner.decode_step(rows, self.runner.kv_bucket(columns))
        self.decode_steps += 1

    def _retire(self, slots: list[int]) -> list[Segment]:
        self._release(slots)
        return [self.scheduler.retire(slot) for slot in slots]

    def _release(self, slots: list[int]) -> None:
        """Forget slots that have left (their blocks are back in the scheduler's pool)."""
        for slot in slots:
            del self._joined[slot]
        self._deepest_start = self._deepest()
        self.runner.clear_blocks(slots)

    def _deepest(self) -> int:
        # After its prefill a slot has drawn step 0: its next decode step attends prompt + 1 columns,
        # one more at each step after.
        return max((tokens + 1 - joined for tokens, joined in self._joined.values()), default=0)


def embed_prompts(model: LoadedModel, segments: list[Segment]) -> tuple[torch.Tensor, torch.Tensor]:
    """The left-padded prompt embeddings (rows, length, width), each with its speaker, and their mask."""
    input_ids, attention_mask, text_mask = encode_prompts(model, segments)
    rows = torch.arange(len(segments), device=model.device).unsqueeze(1)
    return _with_speakers(model, segments, input_ids, _embed(model, input_ids, text_mask), rows), attention_mask


def _packed_embeddings(model: LoadedModel, segments: list[Segment]) -> torch.Tensor:
    """The segments' prompts embedded one after another, (tokens, width), each with its speaker: the
    embeddings :func:`embed_prompts` gives, without the padding."""
    encoded = [encode_prompt(model, segment) for segment in segments]
    lengths = torch.tensor([len(ids) for ids in encoded])
    # Text everywhere but on a speaker sample's codes, which end its prompt.
    text_mask = torch.cat(
        [
            torch.arange(len(ids)) < len(ids) - segment.sample_steps
            for segment, ids in zip(segments, encoded, strict=True)
        ]
    )
    rows = torch.repeat_interleave(torch.arange(len(segments)), lengths)
    input_ids, text_mask, rows = (to_device(host, model.device) for host in (torch.cat(encoded), text_mask, rows))
    return _with_speakers(model, segments, input_ids, _embed(model, input_ids, text_mask), rows)


def _embed(model: LoadedModel, input_ids: torch.Tensor, text_mask: torch.Tensor) -> torch.Tensor:
    """ChatTTS's prompt embedding (``Embed``: a text token's embedding where ``text_mask`` holds, else the
    sum of the codebooks' code embeddings), to the bit, without its boolean indexing: that reads the
    mask's count back from the device, and before every prefill pass the host waited for all the decode
    steps queued there (torch's sync debug mode on an H200)."""
    embed = model.chat.embed
    text = embed.emb_text(input_ids[..., 0].masked_fill(~text_mask, 0))
    codes = input_ids.masked_fill(text_mask.unsqueeze(-1), 0)
    summed = torch.stack([embed.emb_code[q](codes[..., q]) for q in range(embed.num_vq)], -2).sum(-2)
    return torch.where(text_mask.unsqueeze(-1), text, summed.to(text.dtype))


def encode_prompts(model: LoadedModel, segments: list[Segment]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The segments' prompts as ChatTTS's tokenizer gives them for a batch (left-padded ids, attention
    mask, text mask: false on the padding and on a speaker sample's codes), from each segment's own
    encoding (:func:`encode_prompt`), on the device."""
    return tuple(to_device(host, model.device) for host in _padded_prompts(model, segments))


def _padded_prompts(model: LoadedModel, segments: list[Segment]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`encode_prompts`, on the host."""
    encoded = [encode_prompt(model, segment) for segment in segments]
    longest = max(len(ids) for ids in encoded)
    input_ids = torch.zeros(len(encoded), longest, encoded[0].shape[1], dtype=encoded[0].dtype)
    attention_mask = torch.zeros(len(encoded), longest, dtype=torch.long)
    text_mask = torch.zeros(len(encoded), longest, dtype=torch.bool)
    for row, (segment, ids) in enumerate(zip(segments, encoded, strict=True)):
        input_ids[row, longest - len(ids) :] = ids
        attention_mask[row, longest - len(ids) :] = 1
        text_mask[row, longest - len(ids) : longest - segment.sample_steps] = True
    return input_ids, attention_mask, text_mask


def encode_prompt(model: LoadedModel, segment: Segment) -> torch.Tensor:
    """The token ids of a segment's prompt (on the CPU; positions x codebooks: each text token in every
    codebook, then a speaker sample's codes), as ChatTTS's tokenizer encodes it alone, once, kept on
    the segment."""
    tokenise_prompts(model, [segment])
    return segment.prompt_ids


def tokenise_prompts(model: LoadedModel, segments: list[Segment]) -> None:
    """Encode the prompts of the segments not encoded yet (see :func:`encode_prompt`), their texts in one
    call of the tokenizer. ChatTTS's ``Tokenizer.encode`` calls it once a text even for a list: 1,536
    prompts took 0.67 s of an H200 host's workload (cProfile), and a burst's first prefill pass waited
    for its 512; batched, 512 of the standard workload's prompts take 87-107 ms instead of 180-246 (a
    2-core CPU)."""
    pending = [segment for segment in segments if segment.prompt_ids is None]
    if not pending:
        return
    codebooks = model.chat.config.gpt.num_vq
    texts = model.chat.tokenizer._tokenizer([segment.prompt for segment in pending], add_special_tokens=False)
    for segment, ids in zip(pending, texts["input_ids"], strict=True):
        text = torch.tensor(ids, dtype=torch.long).unsqueeze(-1).expand(-1, codebooks).clone()
        segment.prompt_ids = text if segment.sample is None else torch.cat([text, segment.sample.t().long()])


def _with_speakers(
    model: LoadedModel, segments: list[Segment], input_ids: torch.Tensor, embeddings: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    """The embeddings with each segment's speaker in its prompt's speaker slot (a prompt with a speaker
    sample has none: its row of ``speakers`` is never used); ``rows``, the segment (its index in
    ``segments``) of each of ``input_ids``' positions, or of each row of them."""
    # As ChatTTS's Speaker.apply: an embedding string decodes to float16, normalised as such on the CPU.
    none = torch.zeros(embeddings.shape[-1], dtype=torch.half)
    speakers = torch.stack(
        [none if s.speaker is None else F.normalize(s.speaker.cpu().half(), p=2.0, dim=0, eps=1e-12) for s in segments]
    )
    speakers = to_device(speakers, model.device)
    is_speaker_slot = input_ids[..., 0].eq(model.chat.tokenizer.spk_emb_ids).unsqueeze(-1)
    return torch.where(is_speaker_slot, speakers[rows].to(embeddings.dtype), embeddings)


def row_sampling(segments: list[Segment], device: torch.device) -> RowSampling:
    return RowSampling(
        temperature=to_device([segment.request.temperature for segment in segments], device),
        top_p=to_device([segment.request.top_p for segment in segments], device, torch.float64),
        top_k=to_device([segment.request.top_k for segment in segments], device),
        repetition_penalty=to_device([segment.request.repetition_penalty for segment in segments], device),
        seed=to_device([segment.seed for segment in segments], device, torch.long),
    )


def _reason(code: int, count: int, segment: Segment) -> str:
    if code == ENDED_BY_EOS:
        return "eos"
    if code == INTERRUPTED:
        return "interrupted"
    return "length_rule" if count == segment.pinned_tokens else "token_limit"
