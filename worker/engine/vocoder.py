"""GPT hidden states to 24 kHz audio: rows of any lengths share batches, each decoded exactly as alone.

ChatTTS's Decoder (a DVAE decoder that reads each hidden state as two mel frames) and Vocos are
convolutional and pad every layer with zeros, so zero-padding a short row to a long one's length
changes the short row's end. Instead each row (its hidden states, one frame per GPT step) is cut into
windows of one fixed length that overlap by the receptive field of both networks: of a window's
output only the frames that do not see its edges are kept, except at the row's own start and end,
where the windows are aligned to the row so that the padding there is the padding the row sees
alone. The windows of all rows then share batches. A row no longer than a window is decoded whole,
with the rows of exactly its length.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from worker.model import LoadedModel

# A streamed piece's audio may differ from the whole row's by this much (issue 12 holds joined chunks to
# the unstreamed audio within 1e-4; the margin covers hidden states unlike the probe's, and rounding).
STREAM_CONTEXT_TOLERANCE = 1e-5
# Frames of the probe's row kept by its pieces, at its start and in its middle.
_PROBE_KEEP_FRAMES = 12

# A window is this many receptive fields long, so half of it is kept and each frame is decoded about
# twice. Longer windows waste less, but leave more rows shorter than a window, which batch only with
# rows of their exact length.
WINDOW_CONTEXTS = 4


@dataclass(frozen=True)
class Window:
    """Frames [start, stop) of a row are decoded together; the output of frames [keep_start, keep_stop) is kept."""

    start: int
    stop: int
    keep_start: int
    keep_stop: int


def plan_windows(frames: int, size: int, context: int) -> list[Window]:
    """The windows of a row of ``frames`` frames, in order; their kept ranges cover every frame once.

    Every window is ``size`` frames long, but a row of at most ``size`` frames is one window of its
    own. A kept frame is at least ``context`` frames from each edge of its window that is not an edge
    of the row.
    """
    if size <= 2 * context:
        raise ValueError(f"a window of {size} frames keeps nothing with {context} frames of context each side")
    if frames <= size:
        return [Window(0, frames, 0, frames)] if frames else []
    windows = [Window(0, size, 0, size - context)]
    while windows[-1].keep_stop < frames:
        keep_start = windows[-1].keep_stop
        start = keep_start - context
        if start + size >= frames:
            windows.append(Window(frames - size, frames, keep_start, frames))
        else:
            windows.append(Window(start, start + size, keep_start, start + size - context))
    return windows


class Vocoder:
    """Decodes rows of hidden states in batches of at most ``max_windows_per_batch`` windows."""

    def __init__(self, model: LoadedModel, max_windows_per_batch: int):
        chat = model.chat
        self.decoder = chat.decoder
        self.width = chat.config.gpt.hidden_size
        self.vocos = chat.vocos
        self.max_windows_per_batch = max_windows_per_batch
        istft = chat.vocos.head.istft
        # DVAE.forward splits each hidden state's channels into two halves, two mel frames in a row.
        mel_frames_per_frame = chat.config.gpt.hidden_size // chat.config.decoder.idim
        self.samples_per_frame = mel_frames_per_frame * istft.hop_length
        # A sample overlaps the windows of the STFT frames within half a window of it.
        istft_reach = math.ceil(istft.win_length / 2 / istft.hop_length)
        mel_reach = _conv_reach([chat.decoder.decoder, chat.decoder.out_conv, chat.vocos.backbone]) + istft_reach
        self.context_frames = math.ceil(mel_reach / mel_frames_per_frame)
        self.window_frames = WINDOW_CONTEXTS * self.context_frames

    @torch.inference_mode()
    def measure_stream_context(self, tolerance: float = STREAM_CONTEXT_TOLERANCE) -> int:
        """The fewest frames of context either side of a streamed piece that keep its audio within
        ``tolerance`` of the whole row's.

        The receptive field (``context_frames``) bounds what a frame's audio can read; what it does read
        depends on the weights (layer scales, learned filters), so it is measured on this model's own
        networks with a random row of hidden states, on the CPU: its float32 rounds near 1e-6, where a
        GPU's TF32 convolutions round near 1e-3 and would hide the weights' reach. The error shrinks as
        the context grows, so a binary search takes a handful of decodes.
        """
        decoder = copy.deepcopy(self.decoder).to("cpu")
        vocos = copy.deepcopy(self.vocos).to("cpu")

        def audio(states: torch.Tensor) -> torch.Tensor:
            return vocos.decode(decoder(states.T[None].contiguous()))[0]

        full = self.context_frames
        generator = torch.Generator().manual_seed(0)
        row = torch.randn(3 * full + 3 * _PROBE_KEEP_FRAMES, self.width, generator=generator)
        whole = audio(row)
        per_frame = self.samples_per_frame
        # A piece at the row's start (where the row's own edge is its left context) and one in its middle.
        keeps = [(0, _PROBE_KEEP_FRAMES), (full + _PROBE_KEEP_FRAMES, full + 2 * _PROBE_KEEP_FRAMES)]

        def error(context: int) -> float:
            worst = 0.0
            for keep_from, keep_to in keeps:
                start = max(0, keep_from - context)
                samples = audio(row[start : keep_to + context])
                kept = samples[(keep_from - start) * per_frame : (keep_to - start) * per_frame]
                expected = whole[keep_from * per_frame : keep_to * per_frame]
                if kept.shape != expected.shape:  # the ISTFT's last frame lacked its right neighbour
                    return float("inf")
                worst = max(worst, float((kept - expected).abs().max()))
            return worst

        fewest, enough = 0, full
        while fewest < enough:
            middle = (fewest + enough) // 2
            if error(middle) <= tolerance:
                enough = middle
            else:
                fewest = middle + 1
        return enough

    def plan(self, frames: int) -> list[Window]:
        return plan_windows(frames, self.window_frames, self.context_frames)

    def decode(self, hidden_states: list[torch.Tensor]) -> list[np.ndarray]:
        """Each row's (frames, width) hidden states as float32 samples, equal to ChatTTS decoding the row alone."""
        return self.launch(hidden_states).result()

    @torch.inference_mode()
    def launch(self, hidden_states: list[torch.Tensor]) -> LaunchedDecode:
        """Start decoding rows on the current CUDA stream without waiting for them (on the CPU: decode them);
        the samples are the launch's ``result()``."""
        plans = [self.plan(states.shape[0]) for states in hidden_states]
        by_length: dict[int, list[tuple[int, int, Window]]] = {}  # window length -> (row, place in its plan, window)
        for row, plan in enumerate(plans):
            for index, window in enumerate(plan):
                by_length.setdefault(window.stop - window.start, []).append((row, index, window))
        batches = []
        for windows in by_length.values():
            for first in range(0, len(windows), self.max_windows_per_batch):
                batch = windows[first : first + self.max_windows_per_batch]
                audio = self._decode_windows(
                    [hidden_states[row][window.start : window.stop] for row, _, window in batch]
                )
                batches.append((batch, _to_host(audio)))
        done = None
        if any(audio.is_pinned() for _, audio in batches):
            done = torch.cuda.Event()
            done.record()
        return LaunchedDecode(self.samples_per_frame, [len(plan) for plan in plans], batches, done)

    def _decode_windows(self, windows: list[torch.Tensor]) -> torch.Tensor:
        """Windows of equal length, (frames, width) each, as (windows, samples); as ChatTTS's _decode_to_wavs."""
        batch = torch.stack(windows).transpose(1, 2).contiguous()  # (windows, width, frames)
        return self.vocos.decode(self.decoder(batch)).float()


@dataclass
class LaunchedDecode:
    """Rows whose decoding has been launched: their windows' audio lands in host memory by ``done``."""

    samples_per_frame: int
    windows_per_row: list[int]
    batches: list[tuple[list[tuple[int, int, Window]], torch.Tensor]]  # (row, place, window) each; their audio
    done: torch.cuda.Event | None  # None: the audio is there already

    def ready(self) -> bool:
        return self.done is None or self.done.query()

    def result(self) -> list[np.ndarray]:
        if self.done is not None:
            self.done.synchronize()
        pieces: list[list[np.ndarray | None]] = [[None] * count for count in self.windows_per_row]
        for batch, audio in self.batches:
            for (row, index, window), samples in zip(batch, audio.numpy(), strict=True):
                # The ISTFT may give a row fewer samples than its frames' share (ChatTTS's centred one
                # gives a hop fewer); so does the row's last window, and the slice stops at its end.
                keep_from = (window.keep_start - window.start) * self.samples_per_frame
                keep_to = (window.keep_stop - window.start) * self.samples_per_frame
                pieces[row][index] = samples[keep_from:keep_to]
        return [np.concatenate(row_pieces) if row_pieces else np.zeros(0, dtype=np.float32) for row_pieces in pieces]


def _to_host(audio: torch.Tensor) -> torch.Tensor:
    """The audio copied to (pinned) host memory without waiting: the copy lands when the stream gets there."""
    if audio.device.type != "cuda":
        return audio
    host = torch.empty(audio.shape, dtype=audio.dtype, pin_memory=True)
    host.copy_(audio, non_blocking=True)
    return host


def _conv_reach(modules: Iterable[nn.Module]) -> int:
    """How many frames to each side one output frame reads, through every stride-1 Conv1d of the modules.

    Summing is exact for convolutions applied one after the other, as in these ConvNeXt stacks (a
    residual branch holds one convolution), and an upper bound otherwise.
    """
    reach = 0
    for module in modules:
        for conv in module.modules():
            if isinstance(conv, nn.Conv1d):
                assert conv.stride == (1,), f"{conv} changes the frame rate"
                (kernel,), (dilation,), (padding,) = conv.kernel_size, conv.dilation, conv.padding
                reach += max(padding, dilation * (kernel - 1) - padding)
    return reach
