"""What the vocoder decodes: a segment's drawn frames, whole or a streamed part with its context.

Made by the pipeline (a finished segment's whole row) and by a stream's cuts
(worker.engine_process.streaming); decoded by the vocoder's stream (worker.vocoder.stream).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from worker.engine.segment import Segment


@dataclass(eq=False)
class Piece:
    """Hidden states of frames [start, start + len(hiddens)) of a segment, to be decoded into the audio of
    frames [keep_from, ...): to the row's end when ``last``, else up to ``keep_to``.

    Frames outside [keep_from, keep_to) are context only: a kept frame's audio reads the frames near it
    (see :mod:`worker.engine_process.streaming`), so the piece starts that far before it (or at the row's start).
    """

    segment: Segment
    hiddens: torch.Tensor  # (frames, gpt width)
    start: int
    keep_from: int
    keep_to: int
    last: bool  # the piece ends where the segment ends
    assess: bool  # run the quality gate on the audio (a whole row's piece)

    @classmethod
    def whole(cls, segment: Segment) -> Piece:
        frames = segment.output.hiddens.shape[0]
        return cls(segment, segment.output.hiddens, 0, 0, frames, last=True, assess=True)
