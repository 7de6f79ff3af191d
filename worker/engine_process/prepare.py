"""Requests made ready for the engine: text split into segments (``segmenting``), normalised
(``text_normaliser``) and (if asked) refined, each segment with its voice (``voices``) and its seed.

The first step of the engine process's pipeline (see worker.engine_process.pipeline): a request that
cannot be spoken is refused here, naming its field, before any of it reaches the GPU; one that can
becomes a :class:`~worker.engine_process.synthesis.Synthesis`.
"""

from __future__ import annotations

import secrets

from chattts_farm.contract import InvalidRequest, SynthesisRequest
from chattts_farm.settings import Settings
from chattts_farm.speech_length import expected_tokens
from chattts_farm.ssml import Silence
from chattts_farm.text import NOTHING_SPEAKABLE, caption_of, is_speakable
from worker.audio import SAMPLE_RATE
from worker.engine.segment import Segment, segment_seed
from worker.engine_process import voices
from worker.engine_process.segmenting import split_segments
from worker.engine_process.synthesis import Synthesis
from worker.engine_process.text_normaliser import TextNormaliser
from worker.model.loading import LoadedModel


class Preparer:
    """Turns requests into the segments the engine runs, on one model."""

    def __init__(self, model: LoadedModel, settings: Settings):
        self.model = model
        self.settings = settings
        self._normalise = TextNormaliser(model.chat.normalizer)

    def prepare(self, number: int, request: SynthesisRequest) -> Synthesis:
        """A request as segments for the engine; :class:`InvalidRequest` names the field it cannot use."""
        if len(request.text) > self.settings.max_text_chars:
            raise InvalidRequest(
                "text", f"has {len(request.text)} characters; the maximum is {self.settings.max_text_chars}"
            )
        voice = voices.spoken_voice(self.model.chat, request.voice)
        audio_seed = request.seed if request.seed is not None else secrets.randbits(32)
        spoken, silences = self._spoken(request)
        if not spoken:
            raise InvalidRequest("text", NOTHING_SPEAKABLE)
        segments = [
            Segment(
                owner=number,
                index=index,
                text=text,
                request=request,
                speaker=voice.speaker,
                sample=voice.sample,
                transcript=voice.transcript,
                seed=segment_seed(audio_seed, index),
                expected_tokens=expected_tokens(text, speed),
                max_tokens=self.settings.max_new_tokens,
                pinned=self.model.is_synthetic,
                priority=request.priority,
                caption=caption_of(piece),
                speed=speed,
            )
            for index, (text, piece, speed) in enumerate(spoken)
        ]
        return Synthesis(request, number, audio_seed, voice.embedding, segments, silences)

    def _spoken(self, request: SynthesisRequest) -> tuple[list[tuple[str, str, int]], list[int]]:
        """The segments of a request's script that say something, each (normalised text, its piece of the
        text, speed), and the samples of silence before each and after the last: a <break>'s where one
        was asked for (breaks with nothing speakable between them add up), else the pause between
        segments (none before the first or after the last)."""
        pause = round(self.settings.segment_pause_s * SAMPLE_RATE)
        spoken: list[tuple[str, str, int]] = []
        silences: list[int] = []
        asked: int | None = None  # the silence breaks asked for since the last segment
        for item in request.script:
            if isinstance(item, Silence):
                asked = (asked or 0) + round(item.ms * SAMPLE_RATE / 1000)
                continue
            for piece in split_segments(item.text, self.settings.max_segment_chars):
                text = self._normalise(piece)
                if is_speakable(text):
                    usual = pause if spoken else 0
                    silences.append(usual if asked is None else asked)
                    spoken.append((text, piece, item.speed or request.speed))
                    asked = None
        silences.append(asked or 0)
        return spoken, silences

    def refine(self, prepared: list[Synthesis]) -> None:
        """Run ChatTTS's refine-text step on the segments of the requests that asked for it.

        ChatTTS refines a list of texts under one prompt, so requests are grouped by their levels.
        """
        import ChatTTS

        groups: dict[str, list[tuple[Synthesis, Segment]]] = {}
        for entry in prepared:
            if entry.request.refine_text is not None:
                groups.setdefault(entry.request.refine_text.prompt, []).extend((entry, s) for s in entry.segments)
        chat = self.model.chat
        for prompt, members in groups.items():
            texts = [segment.text for _, segment in members]
            # Random weights never end a text on their own: the length rule pins it to the input's length.
            pinned = (
                max(len(chat.tokenizer._tokenizer.tokenize(text)) for text in texts) if self.model.is_synthetic else 0
            )
            params = ChatTTS.Chat.RefineTextParams(
                prompt=prompt,
                show_tqdm=False,
                manual_seed=members[0][0].seed,
                min_new_token=pinned,
                max_new_token=pinned or 384,
            )
            for chunk_start in range(0, len(members), self.settings.max_segments_per_pass):
                chunk = [
                    segment for _, segment in members[chunk_start : chunk_start + self.settings.max_segments_per_pass]
                ]
                refined = chat._refine_text([segment.text for segment in chunk], self.model.device, params)
                ids = [tokens[tokens.less(chat.tokenizer.break_0_ids)] for tokens in refined.ids]
                for segment, text in zip(chunk, chat.tokenizer.decode(ids), strict=True):
                    # Refining can drop everything speakable; the plain text is better than silence.
                    if is_speakable(text):
                        segment.text = text
                        segment.expected_tokens = expected_tokens(text, segment.speed)
                refined.destroy()
