"""Decoding a segment's hidden states into audio."""

from __future__ import annotations

import numpy as np
import torch

from worker.model import LoadedModel


@torch.inference_mode()
def decode(model: LoadedModel, hidden_states: list[torch.Tensor], max_rows_per_pass: int) -> list[np.ndarray]:
    """Turn each row's hidden states into 24 kHz samples.

    Rows are decoded together only with rows of the same length: the decoder and vocoder are
    convolutional, so zero padding would colour the end of shorter rows.
    """
    chat = model.chat
    samples: list[np.ndarray | None] = [None] * len(hidden_states)
    by_length: dict[int, list[int]] = {}
    for index, states in enumerate(hidden_states):
        by_length.setdefault(states.shape[0], []).append(index)
    for length, indices in by_length.items():
        for start in range(0, len(indices), max_rows_per_pass):
            chunk = indices[start : start + max_rows_per_pass]
            if length == 0:
                for index in chunk:
                    samples[index] = np.zeros(0, dtype=np.float32)
                continue
            batch = torch.stack([hidden_states[i] for i in chunk]).permute(0, 2, 1).contiguous()
            mel = chat.decoder(batch)
            audio = chat.vocos.decode(mel).float().cpu().numpy()
            for row, index in enumerate(chunk):
                samples[index] = audio[row]
    return samples
