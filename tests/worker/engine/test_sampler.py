"""Per-row sampling: each row's draw depends on its own settings and seed alone, and each row's tokens are
filtered exactly as stock ChatTTS filters them."""

import pytest
import torch
from ChatTTS.model.processors import gen_logits

from worker.engine.sampler import NO_TOKEN, REPETITION_WINDOW, RowSampling, filtered_logits, sample, uniform_noise

VOCAB = 626
EOS = VOCAB - 1
CODEBOOKS = 4


def settings(rows, temperature=1.0, top_p=1.0, top_k=VOCAB, penalty=1.0, seeds=None):
    return RowSampling(
        temperature=torch.full((rows,), temperature),
        top_p=torch.full((rows,), top_p, dtype=torch.float64),
        top_k=torch.full((rows,), top_k),
        repetition_penalty=torch.full((rows,), penalty),
        seed=torch.tensor(seeds if seeds is not None else list(range(rows)), dtype=torch.long),
    )


def no_eos_block(rows):
    return torch.zeros(rows, dtype=torch.bool)


def no_history(rows, codebooks=CODEBOOKS):
    return torch.zeros(rows, 0, codebooks, dtype=torch.long)


def kept(logits):
    return set(logits.isfinite().nonzero().flatten().tolist())


def test_noise_is_uniform_in_the_open_interval_and_a_function_of_seed_and_step():
    noise = uniform_noise(torch.tensor([1, 2]), 3, 4, VOCAB)
    assert noise.shape == (2, 4, VOCAB)
    assert noise.min() > 0 and noise.max() < 1
    assert abs(noise.mean().item() - 0.5) < 0.02
    assert torch.equal(noise[1], uniform_noise(torch.tensor([2]), 3, 4, VOCAB)[0])
    assert not torch.equal(noise[0], noise[1])
    assert not torch.equal(noise, uniform_noise(torch.tensor([1, 2]), 4, 4, VOCAB))


def test_each_row_may_be_at_its_own_step_and_gets_the_noise_of_that_step():
    seeds, steps = torch.tensor([1, 2, 3]), torch.tensor([0, 7, 300])
    noise = uniform_noise(seeds, steps, 4, VOCAB)
    for row in range(3):
        assert torch.equal(noise[row], uniform_noise(seeds[row : row + 1], int(steps[row]), 4, VOCAB)[0])
        assert torch.equal(noise[row], uniform_noise(seeds[row : row + 1], steps[row], 4, VOCAB)[0])


def test_a_row_at_its_own_step_draws_what_it_draws_at_that_step_alone():
    logits = torch.randn(3, 4, VOCAB)
    steps = torch.tensor([2, 9, 40])
    together = sample(logits, no_history(3), settings(3, seeds=[5, 6, 7]), steps, EOS, no_eos_block(3))
    for row, seed in enumerate([5, 6, 7]):
        alone = sample(
            logits[row : row + 1], no_history(1), settings(1, seeds=[seed]), int(steps[row]), EOS, no_eos_block(1)
        )
        assert torch.equal(together[row], alone[0])


def test_a_row_draws_the_same_token_whatever_its_batch_mates():
    logits = torch.randn(3, 4, VOCAB)
    together = sample(logits, no_history(3), settings(3, seeds=[5, 6, 7]), 2, EOS, no_eos_block(3))
    alone = sample(logits[1:2], no_history(1), settings(1, seeds=[6]), 2, EOS, no_eos_block(1))
    assert torch.equal(together[1], alone[0])


def test_draws_follow_the_distribution():
    logits = torch.log(torch.tensor([0.7, 0.2, 0.1] + [1e-9] * (VOCAB - 3))).expand(4000, 1, VOCAB).clone()
    chosen = sample(logits, no_history(4000, 1), settings(4000), 0, EOS, no_eos_block(4000))
    frequencies = torch.bincount(chosen.flatten(), minlength=3)[:3] / 4000
    assert torch.allclose(frequencies, torch.tensor([0.7, 0.2, 0.1]), atol=0.03)


def test_top_p_drops_the_least_likely_tokens_while_they_add_up_to_at_most_1_minus_top_p():
    logits = torch.full((1, 1, VOCAB), -torch.inf)
    # Powers of two, so that the probabilities and their sums are exact.
    logits[0, 0, :7] = torch.tensor([0.25, 0.25, 0.125, 0.125, 0.125, 0.0625, 0.0625]).log()
    filtered = filtered_logits(logits, no_history(1, 1), settings(1, top_p=0.875), EOS, no_eos_block(1))
    assert kept(filtered) == {0, 1, 2, 3, 4}


def test_top_p_and_top_k_never_keep_fewer_than_three_tokens_as_in_chattts():
    logits = torch.log(torch.tensor([0.9, 0.05, 0.03, 0.02] + [1e-12] * (VOCAB - 4))).view(1, 1, VOCAB)
    for tight in (settings(1, top_k=1), settings(1, top_p=0.01), settings(1, top_k=2, top_p=0.01)):
        assert kept(filtered_logits(logits, no_history(1, 1), tight, EOS, no_eos_block(1))) == {0, 1, 2}


def test_a_blocked_eos_still_takes_a_top_k_place_as_in_chattts():
    logits = torch.zeros(1, 1, VOCAB)
    logits[..., EOS], logits[..., 0], logits[..., 1], logits[..., 2] = 4.0, 3.0, 2.0, 1.0
    filtered = filtered_logits(logits, no_history(1, 1), settings(1, top_k=3), EOS, torch.tensor([True]))
    assert kept(filtered) == {0, 1}


def test_blocked_rows_never_draw_eos():
    logits = torch.full((2, 4, VOCAB), -10.0)
    logits[..., EOS] = 10.0
    chosen = sample(logits, no_history(2), settings(2), 0, EOS, torch.tensor([True, False]))
    assert not chosen[0].eq(EOS).any() and chosen[1].eq(EOS).all()


def test_the_penalty_divides_positive_and_multiplies_negative_logits_by_penalty_to_the_count():
    logits = torch.zeros(1, 1, VOCAB)
    logits[..., 3], logits[..., 4] = 1.0, -1.0
    history = torch.tensor([3, 3, 3, 4, 4, 9]).view(1, -1, 1)
    filtered = filtered_logits(logits, history, settings(1, penalty=1.5), EOS, no_eos_block(1))
    assert filtered[0, 0, 3].item() == pytest.approx(1.0 / 1.5**3)
    assert filtered[0, 0, 4].item() == pytest.approx(-1.0 * 1.5**2)
    assert filtered[0, 0, 5].item() == 0.0


def test_only_the_last_repetition_window_steps_are_penalised():
    logits = torch.ones(1, 1, VOCAB)
    old_then_recent = torch.tensor([7] + [1] * REPETITION_WINDOW).view(1, -1, 1)
    filtered = filtered_logits(logits, old_then_recent, settings(1, penalty=1.5), EOS, no_eos_block(1))
    assert filtered[0, 0, 7].item() == 1.0
    assert filtered[0, 0, 1].item() == pytest.approx(1.5**-REPETITION_WINDOW)


# Each row's (temperature, top_p, top_k, repetition_penalty, eos blocked, steps generated so far).
MIXED_ROWS = [
    (1.0, 0.7, 20, 1.05, True, 24),  # ChatTTS's defaults, a history longer than the window
    (0.3, 1.0, 626, 1.0, False, 0),
    (0.7, 0.01, 20, 1.3, True, 5),  # a tiny top_p
    (1.0, 0.9, 1, 1.0, False, 16),  # top_k below three
    (1.3, 0.5, 2, 2.0, True, 40),
    (0.5, 0.95, 50, 1.1, False, 9),
    (1e-4, 0.7, 20, 1.05, True, 12),  # as good as greedy
    (0.8, 0.99, 3, 1.8, True, 3),
]


def stock_filtered_logits(logits, steps_generated, temperature, top_p, top_k, penalty, eos_blocked):
    """One row through stock ChatTTS's audio-mode filtering in GPT.generate: logits (codebooks, vocab),
    steps_generated (steps, codebooks)."""
    warpers, processors = gen_logits(num_code=EOS, top_P=top_p, top_K=top_k, repetition_penalty=penalty)
    scores = logits / torch.tensor([temperature] * logits.shape[0]).view(-1, 1)
    for process in (*processors, *warpers):
        scores = process(steps_generated.T, scores)
    if eos_blocked:
        scores[:, EOS] = -torch.inf
    return scores


def recent_ring(steps_generated):
    """The runner's window of recent tokens: step s in slot s % REPETITION_WINDOW, NO_TOKEN where none yet."""
    ring = torch.full((REPETITION_WINDOW, steps_generated.shape[1]), NO_TOKEN, dtype=torch.long)
    for step, tokens in enumerate(steps_generated):
        ring[step % REPETITION_WINDOW] = tokens
    return ring


def test_each_row_is_filtered_as_stock_chattts_filters_it_with_that_rows_settings():
    generator = torch.Generator().manual_seed(11)
    rows = len(MIXED_ROWS)
    logits = 3 * torch.randn(rows, CODEBOOKS, VOCAB, generator=generator)
    logits[5, :, EOS] = logits[5].max() + 1  # EOS the likeliest token, not blocked
    logits[7, :, EOS] = logits[7].max() + 1  # and blocked
    # Histories drawn from each row's likeliest tokens, so that the penalty reorders the nucleus.
    histories = [
        torch.multinomial(torch.softmax(logits[row], -1), steps, replacement=True, generator=generator).T
        if steps
        else torch.zeros(0, CODEBOOKS, dtype=torch.long)
        for row, (*_, steps) in enumerate(MIXED_ROWS)
    ]
    temperature, top_p, top_k, penalty, eos_blocked, _ = zip(*MIXED_ROWS, strict=True)
    sampling = RowSampling(
        temperature=torch.tensor(temperature),
        top_p=torch.tensor(top_p, dtype=torch.float64),
        top_k=torch.tensor(top_k),
        repetition_penalty=torch.tensor(penalty),
        seed=torch.arange(rows),
    )
    recent = torch.stack([recent_ring(history) for history in histories])

    filtered = filtered_logits(logits, recent, sampling, EOS, torch.tensor(eos_blocked))

    for row, (history, settings_of_row) in enumerate(zip(histories, MIXED_ROWS, strict=True)):
        stock = stock_filtered_logits(logits[row], history, *settings_of_row[:-1])
        assert torch.equal(filtered[row].isfinite(), stock.isfinite()), row
        # Equal up to float32 rounding: ChatTTS's own penalty differs in the last bit with the batch's size.
        torch.testing.assert_close(torch.softmax(filtered[row], -1), torch.softmax(stock, -1), rtol=1e-5, atol=1e-7)
