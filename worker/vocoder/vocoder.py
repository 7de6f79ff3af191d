"""GPT hidden states to 24 kHz audio: rows of any lengths share batches, each decoded as alone.

ChatTTS's Decoder (a DVAE decoder that reads each hidden state as two mel frames) and Vocos are
convolutional and pad every layer with zeros, so zero-padding a short row to a long one's length
would change the short row's end, unless every layer that reads across frames reads the padding as
its own zeros: the network does so, given each window's length (:class:`VocoderNetwork`). A row
(its hidden states, one frame per GPT step) of up to ``MAX_WINDOW_CONTEXTS`` receptive fields (~17 s
at full scale) is one window, padded to the next multiple of ``WINDOW_STEP_FRAMES``, so that rows of
different lengths share a size and a batch. A longer row is cut into a few windows of one size that
overlap by at least twice the receptive field of both networks: of a window's output only the frames
that do not see its edges are kept, except at the row's own start and end, where the windows are
aligned to the row so that the padding there is the padding the row sees alone. Decoded whole, a row
of N frames decodes fewer than N + 32 frames; in overlapping windows (as every row of more than two
receptive fields once was), about N + 2 x context: 1.53 frames for each kept frame of the standard
workload's rows (docs/performance.md).

A call's window sizes share batches too, padded to the larger, where the batches saved cost more than
the frames added (:func:`shared_sizes`).

The networks run as :class:`VocoderNetwork`: copies of ChatTTS's modules, in bf16 on CUDA (the ISTFT
head's weights in fp32), with an ISTFT that never waits for the host; on CUDA their ConvNeXt blocks run
channels-last with a fused Triton kernel (worker.vocoder.convnext). On CUDA a batch of windows replays
a CUDA graph captured the first time its (window size, batch bucket) is met, and each window's kept
audio is copied from the GPU straight to its place in its row's host buffer.
"""

from __future__ import annotations

import collections
import copy
import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from worker.engine import device_waits
from worker.engine.attention import triton_available
from worker.engine.runner import SplitWeights, split_product, split_weights, to_device
from worker.model.loading import LoadedModel
from worker.vocoder.convnext import ChannelsLastStack

# A streamed piece's audio may differ from the whole row's by this much (issue 12 holds joined chunks to
# the unstreamed audio within 1e-4; the margin covers hidden states unlike the probe's, and rounding).
STREAM_CONTEXT_TOLERANCE = 1e-5
# Frames of the probe's row kept by its pieces, at its start and in its middle.
_PROBE_KEEP_FRAMES = 12

# Window sizes are multiples of this many frames: finer steps waste fewer frames, coarser ones let more
# rows share a batch (and a graph).
WINDOW_STEP_FRAMES = 32
# The longest window, in receptive fields: a longer one wastes less on long rows but needs more memory
# per window.
MAX_WINDOW_CONTEXTS = 16
# A batch holds at most this many frames (at full scale ~80 KB of working memory each in bf16).
MAX_FRAMES_PER_BATCH = 32768
# A batch costs about as much as decoding this many frames more: the windows of a call's sizes share
# batches, padded to the larger size, where that costs fewer frames than the batches it saves
# (:func:`shared_sizes`). On the forty-first session's H100 (docs/performance.md) the engine's vocoder took
# 0.68-0.69 s of GPU time with this setting and the head's split weights, against 0.71-0.72 s with neither;
# `bench.vocoder --batch-costs` there fit 0.82 ms a batch and 0.76 ms per 1,000 frames, ~1,070 frames a
# batch; in the engine, on the forty-second session's, 1,024 left the vocoder's GPU time as it was and the
# workload 3-4% slower than 2,048 in turn (a batch beside the decode steps costs launches and waits too).
BATCH_COST_FRAMES = 2048


@dataclass(frozen=True)
class Window:
    """Frames [start, stop) of a row are decoded together, as a window of ``size`` frames (zeros after
    ``stop`` where it is longer); the output of frames [keep_start, keep_stop) is kept."""

    start: int
    stop: int
    keep_start: int
    keep_stop: int
    size: int


def plan_windows(frames: int, context: int, step: int, max_size: int) -> list[Window]:
    """The windows of a row of ``frames`` frames, in order; their kept ranges cover every frame once.

    A row of up to ``max_size`` frames is one window, its length rounded up to a multiple of ``step``.
    A longer row's windows are all one size, a multiple of ``step`` of at most ``max_size`` frames, as few
    as fit, spread evenly from the row's start to its end; a kept frame is at least ``context`` frames
    from each edge of its window that is not an edge of the row.
    """
    longest = max_size // step * step
    if longest <= 2 * context + 1:
        raise ValueError(f"a window of {max_size} frames keeps nothing with {context} frames of context each side")
    if not frames:
        return []
    if frames <= longest:
        return [Window(0, frames, 0, frames, _round_up(frames, step))]
    for count in itertools.count(2):
        # Neighbours overlap by 2 x context and a frame more, the most their starts' rounding takes.
        size = _round_up(math.ceil((frames + (count - 1) * (2 * context + 1)) / count), step)
        if size <= longest:
            break
    starts = [(frames - size) * index // (count - 1) for index in range(count)]
    # Each overlap is kept from its middle on by the later window: both halves are >= context.
    bounds = [0, *((start + previous + size) // 2 for previous, start in itertools.pairwise(starts)), frames]
    return [
        Window(start, start + size, keep_start, keep_stop, size)
        for start, keep_start, keep_stop in zip(starts, bounds[:-1], bounds[1:], strict=True)
    ]


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def network_dtype(model: LoadedModel) -> torch.dtype:
    """bf16 on CUDA, unless the GPT runs in fp32 there; fp32 elsewhere.

    An fp16 GPT gets a bf16 vocoder too: the convolutions' activations are not normalised, and fp16's
    range is narrower.
    """
    if model.device.type != "cuda" or model.info.dtype == "fp32":
        return torch.float32
    return torch.bfloat16


class VocoderNetwork(nn.Module):
    """ChatTTS's Decoder and Vocos as one network: (windows, width, frames) hidden states to (windows,
    samples) audio in float32, in ``dtype`` up to the ISTFT head, which runs in float32.

    The modules are copies (ChatTTS's own stay in float32), called layer by layer (:meth:`features`), so
    that windows padded past their rows decode as the rows alone; neither the DVAE decoder nor Vocos's
    ConvNeXt backbone is weight-normalised, so their weights are plain already.

    ``fused`` (by default: on CUDA, where Triton is there) runs the ConvNeXt blocks of both networks
    channels-last (:class:`~worker.vocoder.convnext.ChannelsLastStack`), which then hold the blocks'
    only copies (off CUDA, such a network runs only in Triton's interpreter); otherwise they are
    ChatTTS's and Vocos's modules.
    """

    def __init__(self, decoder: nn.Module, vocos: nn.Module, dtype: torch.dtype, *, fused: bool | None = None):
        super().__init__()
        self.dtype = dtype
        if fused is None:
            fused = decoder.coef.device.type == "cuda" and triton_available()
        self.decoder_blocks = self.backbone_blocks = None
        blocks = (decoder.decoder.decoder_block, vocos.backbone.convnext)
        # features() reproduces DVAE.forward's decoding and VocosBackbone.forward as ChatTTS calls them.
        assert decoder.vq_layer is None and not vocos.backbone.adanorm
        if fused:
            # Built from ChatTTS's float32 modules, so that the folded layer scales are rounded once.
            self.decoder_blocks, self.backbone_blocks = (ChannelsLastStack(stack, dtype) for stack in blocks)
        # The module copies leave out the blocks the stacks hold (deepcopy takes a memo's entry as the copy).
        left_out = {id(stack): nn.ModuleList() for stack in blocks} if fused else {}
        self.decoder = copy.deepcopy(decoder, dict(left_out)).to(dtype)
        self.backbone = copy.deepcopy(vocos.backbone, dict(left_out)).to(dtype)
        # The head's exponential turns bf16's relative rounding of log magnitudes into the audio's: its
        # weights stay float32, multiplied on tensor cores as two bfloat16 terms where the features are
        # bfloat16 (which the terms multiply exactly), on the CUDA cores in float32 otherwise.
        self.spectrum = copy.deepcopy(vocos.head.out).float()
        terms = split_weights(self.spectrum.weight.detach()).terms if dtype == torch.bfloat16 else None
        self.register_buffer("spectrum_terms", terms, persistent=False)
        istft = vocos.head.istft
        assert istft.padding == "center", f"{istft.padding} ISTFT padding"
        self.n_fft, self.hop_length = istft.n_fft, istft.hop_length
        assert self.n_fft % self.hop_length == 0, "the overlap-add sums whole hops"
        self.register_buffer("window", istft.window.detach().clone().float())

    def forward(self, windows: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """(windows, width, frames) hidden states to (windows, samples) audio; with ``lengths`` (windows,)
        int32, each window's first ``length`` frames are its row and the frames after them zeros, and its
        audio's first samples are the row's alone (:meth:`features`, :meth:`istft`), those after not its."""
        windows = windows.to(self.dtype)
        # Each hidden state is two mel frames, each mel frame the head's STFT frame.
        mel_lengths = None if lengths is None else 2 * lengths
        features = self.features(windows, mel_lengths)  # (windows, mel frames, dim)
        head = self.head(features)  # (windows, mel frames, log magnitudes then phases)
        if head.is_cuda:
            return self.audio_without_check(head, mel_lengths)
        log_magnitude, phase = head.transpose(1, 2).chunk(2, dim=1)
        # As Vocos's ISTFTHead writes it.
        spectrum = log_magnitude.exp().clip(max=1e2) * (phase.cos() + 1j * phase.sin())
        return self.istft(spectrum, mel_lengths)

    def head(self, features: torch.Tensor) -> torch.Tensor:
        """Vocos's head's linear layer in float32: (windows, mel frames, dim) features to (windows, mel
        frames, log magnitudes then phases)."""
        if self.spectrum_terms is None:
            return self.spectrum(features.float())
        count, frames, dim = features.shape
        product = split_product(features.reshape(count * frames, dim), SplitWeights(self.spectrum_terms))
        return product.add_(self.spectrum.bias).view(count, frames, -1)

    def features(self, windows: torch.Tensor, mel_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """``self.backbone(self.decoder(windows))``: DVAE.forward's decoding (no quantiser), DVAEDecoder.forward
        and VocosBackbone.forward (no adaptive norm) op for op, the ConvNeXt blocks channels-last where the
        network is fused (on the CPU only in Triton's interpreter).

        With ``mel_lengths``, every layer that reads across frames reads each window's frames from its
        length on as zeros, the padding its row sees alone: those are the convolutions (the blocks'
        depthwise ones too), which is where the windows' frames past their rows are zeroed; every other
        layer is frame by frame."""
        dvae, decoder, backbone = self.decoder, self.decoder.decoder, self.backbone
        count, width, frames = windows.shape
        # Each hidden state's two halves of its channels are two mel-rate frames in a row.
        mel_rate = windows.view(count, 2, width // 2, frames).permute(0, 2, 3, 1).flatten(2)
        inside = None if mel_lengths is None else _inside(mel_lengths, 2 * frames)[:, None, :]

        def padded(x: torch.Tensor) -> torch.Tensor:  # (windows, channels, mel frames)
            return x if inside is None else x.where(inside, 0)

        hidden = mel_rate
        for layer in decoder.conv_in:
            hidden = layer(padded(hidden) if isinstance(layer, nn.Conv1d) else hidden)
        if self.decoder_blocks is not None:
            hidden = self.decoder_blocks(hidden.transpose(1, 2), mel_lengths).transpose(1, 2)
        else:
            for block in decoder.decoder_block:
                hidden = block(padded(hidden))
        mel = dvae.out_conv(padded(decoder.conv_out(hidden))).mul_(dvae.coef)
        # The backbone's norm leaves its activations channels-last, and its final norm takes them so.
        embedded = backbone.norm(backbone.embed(padded(mel)).transpose(1, 2))
        if self.backbone_blocks is not None:
            return backbone.final_layer_norm(self.backbone_blocks(embedded, mel_lengths))
        hidden = embedded.transpose(1, 2)
        for block in backbone.convnext:
            hidden = block(padded(hidden))
        return backbone.final_layer_norm(hidden.transpose(1, 2))

    def istft(self, spectrum: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """``torch.istft(spectrum, center=True)`` with this window; with ``lengths``, each window's audio from
        its first ``length`` STFT frames alone (then zeros): torch.istft of each window, so that on the CPU
        the samples are ChatTTS's to the bit. CUDA runs :meth:`audio_without_check` instead."""
        if lengths is None:
            return self._torch_istft(spectrum)
        audio = spectrum.new_zeros(len(spectrum), self.hop_length * (spectrum.shape[-1] - 1), dtype=torch.float32)
        for index, length in enumerate(lengths.tolist()):
            if length:
                alone = self._torch_istft(spectrum[index, :, :length])
                audio[index, : alone.numel()] = alone
        return audio

    def _torch_istft(self, spectrum: torch.Tensor) -> torch.Tensor:
        return torch.istft(spectrum, self.n_fft, self.hop_length, self.n_fft, self.window, center=True)

    def audio_without_check(self, head: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """The audio :meth:`istft` makes of the head's spectrum, from the head's (windows, STFT frames, log
        magnitudes then phases) float32, reading nothing back: torch.istft checks the window's overlap on the
        host, which stalls the thread that launches it and cannot be captured in a graph. Frames-major
        throughout (a frame's bins, then its samples, side by side in memory), so that every op reads and
        writes in order. With ``lengths``, each window's STFT frames from its length on are left out."""
        windows, stft_frames, _ = head.shape
        log_magnitude, phase = head.split(self.n_fft // 2 + 1, dim=-1)
        if lengths is not None:
            # A frame past its window's length has no magnitude: it adds nothing.
            log_magnitude = log_magnitude.masked_fill(~_inside(lengths, stft_frames)[:, :, None], -math.inf)
        # Vocos's magnitude * (cos + 1j * sin), in one kernel.
        spectrum = torch.polar(log_magnitude.exp().clamp_(max=1e2), phase)
        # A real signal's DC and Nyquist bins are real. The head's phases give them imaginary parts, which
        # the CPU's FFT ignores and cuFFT's inverse kernels do not all ignore: on an H200, 2,304 inverse
        # transforms of 1,024 points in one call came out 9% off, 1,920 exact (2026-12-04), so that a
        # window's audio depended on how many windows shared its batch.
        spectrum.imag[..., 0] = 0
        if self.n_fft % 2 == 0:
            spectrum.imag[..., -1] = 0
        pieces = torch.fft.irfft(spectrum, self.n_fft, dim=-1).mul_(self.window)  # (windows, frames, n_fft)
        # The overlap-add, a hop of samples at a time: each hop is the sum of the pieces of the frames
        # that cover it, one of each of a piece's hops.
        hop, overlaps = self.hop_length, self.n_fft // self.hop_length
        hops = stft_frames + overlaps - 1
        summed = pieces.new_zeros(windows, hops, hop)
        by_hop = pieces.view(windows, stft_frames, overlaps, hop)
        for offset in range(overlaps):
            summed[:, offset : offset + stft_frames].add_(by_hop[:, :, offset])
        # The window's squares summed the same way over the same frames: for each hop, which frames cover
        # it (within the length) times the squares of the window's hops.
        frame = torch.arange(hops, device=head.device)[:, None] - torch.arange(overlaps, device=head.device)
        ends = torch.full((windows,), stft_frames, device=head.device) if lengths is None else lengths
        covering = ((frame >= 0) & (frame < ends[:, None, None])).float()  # (windows, hops, overlaps)
        envelope = covering @ self.window.square().view(overlaps, hop)
        # Past a window's length no frame adds to a sample: 0 / 0 there, where no audio of its row is.
        audio = (summed / envelope.clamp_(min=torch.finfo(torch.float32).tiny)).view(windows, hops * hop)
        trim = self.n_fft // 2
        return audio[:, trim : hops * hop - trim]


def _inside(lengths: torch.Tensor, frames: int) -> torch.Tensor:
    """(windows, frames) bool: whether each frame is within its window's length."""
    return torch.arange(frames, device=lengths.device) < lengths[:, None]


class WindowGraph(NamedTuple):
    """A captured graph of the network over a batch of windows: it reads ``inputs`` and ``lengths`` and
    writes ``audio``."""

    graph: torch.cuda.CUDAGraph
    inputs: torch.Tensor  # (windows, width, frames)
    lengths: torch.Tensor  # (windows,) int32
    audio: torch.Tensor  # (windows, samples)


class WindowGraphs:
    """The network as a CUDA graph per (window frames, batch bucket).

    The graphs replay one after another on the vocoder's stream, so they share all their memory: one
    pool for their activations, one input, lengths and audio buffer, each as large as the largest batch
    (``max_batch_frames`` frames); a replay's audio is to be copied out before the next replays.
    The vocoder captures them all at start (:meth:`capture_every_bucket`); one first met mid-run would
    be captured then, waiting for the decode steps queued and holding the thread that launches them.
    """

    def __init__(
        self,
        network: VocoderNetwork,
        width: int,
        samples_per_frame: int,
        device: torch.device,
        max_batch_frames: int = MAX_FRAMES_PER_BATCH,
    ):
        self.network = network
        self.width = width
        self.device = device
        self.max_batch_frames = max_batch_frames
        self._pool = torch.cuda.graph_pool_handle()
        self._inputs = torch.zeros(max_batch_frames * width, dtype=network.dtype, device=device)
        self._lengths = torch.zeros(max_batch_frames, dtype=torch.int32, device=device)
        self._audio = torch.zeros(max_batch_frames * samples_per_frame, dtype=torch.float32, device=device)
        self._graphs: dict[tuple[int, int], WindowGraph] = {}

    def __len__(self) -> int:
        return len(self._graphs)

    def capture_every_bucket(self, frames: int, most: int) -> None:
        """Capture the graphs of windows of ``frames`` frames in every batch bucket of up to ``most``."""
        for bucket in sorted({batch_bucket(count, most) for count in range(1, most + 1)}, reverse=True):
            self._graph(frames, bucket)

    def __call__(self, windows: torch.Tensor, lengths: torch.Tensor, most: int) -> torch.Tensor:
        """(windows, width, frames) of ``lengths`` (:class:`VocoderNetwork`) as (windows, samples), the batch
        padded to a bucket of at most ``most``; the audio is the graphs' shared buffer, valid until the next call."""
        count, _, frames = windows.shape
        captured = self._graph(frames, batch_bucket(count, most))
        captured.inputs[:count].copy_(windows)
        captured.lengths[:count].copy_(lengths)
        captured.graph.replay()
        return captured.audio[:count]

    def _graph(self, frames: int, bucket: int) -> WindowGraph:
        """The graph of a batch bucket of windows of ``frames`` frames; captured now if it is new."""
        if (frames, bucket) not in self._graphs:
            self._graphs[frames, bucket] = self._capture(frames, bucket)
        return self._graphs[frames, bucket]

    def _capture(self, frames: int, bucket: int) -> WindowGraph:
        if bucket * frames > self.max_batch_frames:
            raise ValueError(f"{bucket} windows of {frames} frames exceed the graphs' {self.max_batch_frames} frames")
        inputs = self._inputs[: bucket * self.width * frames].view(bucket, self.width, frames)
        lengths = self._lengths[:bucket]
        lengths.fill_(frames)
        # One call first, off the capture: cuFFT's plan and cuBLAS's workspace for these shapes.
        stream = torch.cuda.current_stream(self.device)
        warm_up = torch.cuda.Stream(self.device)
        warm_up.wait_stream(stream)
        with torch.cuda.stream(warm_up):
            self.network(inputs, lengths)
        stream.wait_stream(warm_up)
        graph = torch.cuda.CUDAGraph()
        # torch.cuda.graph synchronises the device and empties the memory caches first: without emptying
        # them the capture's pool found no memory on an H200 (the engine leaves little free).
        # Thread-local, as the engine's captures: the ASR gate's Whisper runs on a thread of its own
        # (worker.asr.listener) and a worker's heartbeat asks the GPU for free memory; either's CUDA
        # calls while this thread captures would break a capture in the default global mode.
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            produced = self.network(inputs, lengths)
            audio = self._audio[: produced.numel()].view(produced.shape)
            audio.copy_(produced)
        # ``produced`` goes here: its memory in the pool is the next capture's to use.
        return WindowGraph(graph, inputs, lengths, audio)


def shared_sizes(counts: dict[int, int], batch_windows: Callable[[int], int], batch_cost_frames: int) -> dict[int, int]:
    """The size each window size of a call is decoded at, given how many windows of each size there are and
    how many windows of a size one batch holds: the sizes, ascending, fall in runs, each padded to its
    largest, and the runs are those for which the frames decoded (each batch padded to its bucket, see
    :func:`batch_bucket`) plus ``batch_cost_frames`` a batch are fewest. A window padded past its frames
    decodes as it did (:class:`VocoderNetwork`), so only the cost changes."""
    sizes = sorted(counts)
    windows_before = [0, *itertools.accumulate(counts[size] for size in sizes)]
    fewest = [0]  # fewest[j]: the cost of the first j sizes
    run_start = [0]  # run_start[j]: where the last run of the first j sizes starts
    for end in range(1, len(sizes) + 1):
        size, most = sizes[end - 1], batch_windows(sizes[end - 1])
        cost, start = min(
            (
                fewest[start]
                + _batches_cost(windows_before[end] - windows_before[start], size, most, batch_cost_frames),
                start,
            )
            for start in range(end)
        )
        fewest.append(cost)
        run_start.append(start)
    decoded_at, end = {}, len(sizes)
    while end:
        start = run_start[end]
        decoded_at.update((size, sizes[end - 1]) for size in sizes[start:end])
        end = start
    return decoded_at


def _batches_cost(windows: int, size: int, most: int, batch_cost_frames: int) -> int:
    """The frames ``windows`` windows of ``size`` frames decode in batches of at most ``most`` (the last padded
    to its bucket), and ``batch_cost_frames`` a batch."""
    full, rest = divmod(windows, most)
    padded = full * most + (batch_bucket(rest, most) if rest else 0)
    return padded * size + (full + (rest > 0)) * batch_cost_frames


def batch_bucket(count: int, most: int) -> int:
    """The batch a graph of ``count`` windows runs: the next of 1, 2, 3, 4, 6, 8, 12, ... (padding wastes at
    most a third), or ``most``."""
    power = 1 << max(0, count - 1).bit_length()
    return min(most, 3 * power // 4 if 3 * power // 4 >= count else power)


class Vocoder:
    """Decodes rows of hidden states in batches of at most ``max_windows_per_batch`` windows of one size.

    ``dtype`` and ``fused`` are :class:`VocoderNetwork`'s (by default: :func:`network_dtype`, fused on CUDA);
    ``graphs`` (by default: on CUDA) replays :class:`WindowGraphs`; ``batch_cost_frames`` is what a batch
    costs in frames when a call's window sizes share batches (:func:`shared_sizes`).
    """

    def __init__(
        self,
        model: LoadedModel,
        max_windows_per_batch: int,
        *,
        dtype: torch.dtype | None = None,
        graphs: bool | None = None,
        fused: bool | None = None,
        batch_cost_frames: int = BATCH_COST_FRAMES,
    ):
        chat = model.chat
        self.device = model.device
        self.width = chat.config.gpt.hidden_size
        self.max_windows_per_batch = max_windows_per_batch
        self.batch_cost_frames = batch_cost_frames
        istft = chat.vocos.head.istft
        # DVAE.forward splits each hidden state's channels into two halves, two mel frames in a row.
        mel_frames_per_frame = chat.config.gpt.hidden_size // chat.config.decoder.idim
        self.samples_per_frame = mel_frames_per_frame * istft.hop_length
        # A sample overlaps the windows of the STFT frames within half a window of it.
        istft_reach = math.ceil(istft.win_length / 2 / istft.hop_length)
        mel_reach = _conv_reach([chat.decoder.decoder, chat.decoder.out_conv, chat.vocos.backbone]) + istft_reach
        self.context_frames = math.ceil(mel_reach / mel_frames_per_frame)
        self.max_window_frames = MAX_WINDOW_CONTEXTS * self.context_frames // WINDOW_STEP_FRAMES * WINDOW_STEP_FRAMES
        self._chattts_networks = (chat.decoder, chat.vocos)
        self.network = VocoderNetwork(chat.decoder, chat.vocos, dtype or network_dtype(model), fused=fused)
        use_graphs = model.device.type == "cuda" if graphs is None else graphs
        self.graphs = (
            WindowGraphs(self.network, self.width, self.samples_per_frame, model.device) if use_graphs else None
        )

    @torch.inference_mode()
    def measure_stream_context(self, tolerance: float = STREAM_CONTEXT_TOLERANCE) -> int:
        """The fewest frames of context either side of a streamed piece that keep its audio within
        ``tolerance`` of the whole row's.

        The receptive field (``context_frames``) bounds what a frame's audio can read; what it does read
        depends on the weights (layer scales, learned filters), so it is measured on this model's own
        networks with a random row of hidden states, on the CPU in float32: its rounding is near 1e-6,
        where a GPU's bf16 or TF32 rounds near 1e-3 and would hide the weights' reach. The error shrinks
        as the context grows, so a binary search takes a handful of decodes.
        """
        network = VocoderNetwork(*self._chattts_networks, torch.float32, fused=False).to("cpu")

        def audio(states: torch.Tensor) -> torch.Tensor:
            return network(states.T[None].contiguous())[0]

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

    @torch.inference_mode()
    def capture_windows(self) -> int:
        """Capture now the graphs of every window size, in every batch (on CUDA); return how many graphs the
        vocoder holds.

        Captured when first met instead, each capture held the engine's thread and waited for the decode
        steps queued: 1.9 s of a streaming run when none was captured ahead, and 1.5 s of the host's
        8.7 in the standard workload's engine-alone run after its warm-up, when the streamed pieces'
        short windows were and the whole rows' longer ones were not (py-spy, H200, both).
        """
        if self.graphs is None:
            return 0
        for frames in range(WINDOW_STEP_FRAMES, self.max_window_frames + 1, WINDOW_STEP_FRAMES):
            self.graphs.capture_every_bucket(frames, self.windows_per_batch(frames))
        return len(self.graphs)

    def plan(self, frames: int) -> list[Window]:
        return plan_windows(frames, self.context_frames, WINDOW_STEP_FRAMES, self.max_window_frames)

    def windows_per_batch(self, frames: int) -> int:
        """The most windows of ``frames`` frames one batch holds."""
        return max(1, min(self.max_windows_per_batch, MAX_FRAMES_PER_BATCH // max(frames, 1)))

    def decode(self, hidden_states: list[torch.Tensor]) -> list[np.ndarray]:
        """Each row's (frames, width) hidden states as float32 samples, equal to ChatTTS decoding the row alone."""
        return self.launch(hidden_states).result()

    @torch.inference_mode()
    def launch(self, hidden_states: list[torch.Tensor]) -> LaunchedDecode:
        """Start decoding rows on the current CUDA stream without waiting for them (on the CPU: decode them);
        the samples are the launch's ``result()``.

        Each window's kept audio is copied straight to its place in its row's host buffer (pinned, on
        CUDA), so the rows come back whole. Copied to the host a batch at a time instead, the windows were
        cut and joined into rows there: 1.5 GB of copies on the engine's thread for the standard
        workload's 1,536 rows, 0.9 s of its 6 s (cProfile, H200 host, 2026-12-04).
        """
        plans = [self.plan(states.shape[0]) for states in hidden_states]
        by_plan_size: dict[int, list[tuple[int, Window]]] = {}  # window size -> (row, window), in row order
        for row, plan in enumerate(plans):
            for window in plan:
                by_plan_size.setdefault(window.size, []).append((row, window))
        decoded_at = shared_sizes(
            {size: len(windows) for size, windows in by_plan_size.items()},
            self.windows_per_batch,
            self.batch_cost_frames,
        )
        # A row's windows are of one size, so they stay together and in order.
        by_size: dict[int, list[tuple[int, Window]]] = {}
        for size in sorted(by_plan_size):
            by_size.setdefault(decoded_at[size], []).extend(by_plan_size[size])
        rows = [torch.zeros(0)] * len(plans)  # a row of no frames has no audio
        per_frame = self.samples_per_frame
        for size, windows in by_size.items():
            most = self.windows_per_batch(size)
            spans: list[tuple[int, int]] = []  # each window's (first kept sample, kept samples), as windows
            filled: dict[int, int] = {}  # row -> samples placed so far
            for first in range(0, len(windows), most):
                batch = windows[first : first + most]
                audio = self._decode_windows(*self._stacked(hidden_states, batch, size), most)
                if first == 0:
                    # The ISTFT may give a window fewer samples than its frames' share (ChatTTS's centred one
                    # gives a hop fewer), and so does a row alone: its last window keeps only what it has.
                    short = size * per_frame - audio.shape[1]
                    spans = [_kept_samples(window, per_frame, short) for _, window in windows]
                    kept = collections.Counter()
                    for (row, _), (_, count) in zip(windows, spans, strict=True):
                        kept[row] += count
                    for row, samples in kept.items():
                        rows[row] = _host_samples(samples, self.device)
                for index, (row, _) in enumerate(batch):
                    keep_from, count = spans[first + index]
                    place = filled.get(row, 0)
                    rows[row][place : place + count].copy_(
                        audio[index, keep_from : keep_from + count], non_blocking=True
                    )
                    filled[row] = place + count
        done = None
        if self.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
        return LaunchedDecode(rows, done)

    def _stacked(
        self, hidden_states: list[torch.Tensor], batch: list[tuple[int, Window]], size: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's windows as (windows, width, ``size``), zeros after each window's frames of its row, and
        their lengths, (windows,) int32; neither waits for the device. The padded windows are placed with one
        copy: one a window was a launch a window on the engine's thread, 150 windows in a batch."""
        lengths = [window.stop - window.start for _, window in batch]
        pieces = [hidden_states[row][window.start : window.stop] for row, window in batch]
        if min(lengths) == size:
            stacked = torch.stack(pieces)
        else:
            places = np.concatenate([np.arange(length) + index * size for index, length in enumerate(lengths)])
            stacked = pieces[0].new_zeros(len(batch) * size, self.width)
            stacked.index_copy_(0, to_device(torch.from_numpy(places), stacked.device), torch.cat(pieces))
            stacked = stacked.view(len(batch), size, self.width)
        return stacked.transpose(1, 2), to_device(torch.tensor(lengths, dtype=torch.int32), stacked.device)

    def _decode_windows(self, windows: torch.Tensor, lengths: torch.Tensor, most: int) -> torch.Tensor:
        """(windows, width, frames) of ``lengths`` as (windows, samples): on CUDA by the graph of their
        size and batch bucket, elsewhere op by op."""
        if self.graphs is not None:
            return self.graphs(windows, lengths, most)
        return self.network(windows.contiguous(), lengths)


@dataclass
class LaunchedDecode:
    """Rows whose decoding has been launched: their audio lands in host memory by ``done``."""

    rows: list[torch.Tensor]  # each row's samples, on the host
    done: torch.cuda.Event | None  # None: the audio is there already

    def ready(self) -> bool:
        return self.done is None or self.done.query()

    def result(self) -> list[np.ndarray]:
        if self.done is not None:
            device_waits.wait_for(self.done)
        return [row.numpy() for row in self.rows]


def _kept_samples(window: Window, samples_per_frame: int, short: int) -> tuple[int, int]:
    """Where a window's kept audio starts in its own audio, and how many samples it keeps: the slice stops
    where the audio of its frames of its row stops, ``short`` samples before their share."""
    keep_from = (window.keep_start - window.start) * samples_per_frame
    row_audio = (window.stop - window.start) * samples_per_frame - short
    keep_to = min((window.keep_stop - window.start) * samples_per_frame, row_audio)
    return keep_from, max(0, keep_to - keep_from)


def _host_samples(count: int, device: torch.device) -> torch.Tensor:
    """A row's host buffer for audio decoded on ``device``: pinned there is CUDA, so that the copies into
    it wait for nothing on the host and land when the stream gets there.

    Pinned memory costs ~1 ms a row of the standard workload while a process first grows to hold that
    many rows at once (cudaHostAlloc; H200 host, 2026-12-04); torch caches it once freed, and a row
    then takes ~1 us."""
    return torch.empty(count, dtype=torch.float32, pin_memory=device.type == "cuda")


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
