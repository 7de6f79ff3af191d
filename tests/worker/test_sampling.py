"""Per-row sampling: each row's draw depends on its own settings and seed alone."""

import torch

from worker.sampling import RowSampling, sample, uniform_noise

VOCAB = 626
EOS = VOCAB - 1


def settings(rows, temperature=1.0, top_p=1.0, top_k=VOCAB, penalty=1.0, seeds=None):
    return RowSampling(
        temperature=torch.full((rows,), temperature),
        top_p=torch.full((rows,), top_p),
        top_k=torch.full((rows,), top_k),
        repetition_penalty=torch.full((rows,), penalty),
        seed=torch.tensor(seeds if seeds is not None else list(range(rows)), dtype=torch.long),
    )


def no_eos_block(rows):
    return torch.zeros(rows, dtype=torch.bool)


def test_noise_is_uniform_in_the_open_interval_and_a_function_of_seed_and_step():
    noise = uniform_noise(torch.tensor([1, 2]), 3, 4, VOCAB)
    assert noise.shape == (2, 4, VOCAB)
    assert noise.min() > 0 and noise.max() < 1
    assert abs(noise.mean().item() - 0.5) < 0.02
    assert torch.equal(noise[1], uniform_noise(torch.tensor([2]), 3, 4, VOCAB)[0])
    assert not torch.equal(noise[0], noise[1])
    assert not torch.equal(noise, uniform_noise(torch.tensor([1, 2]), 4, 4, VOCAB))


def test_top_k_one_is_greedy():
    logits = torch.randn(3, 4, VOCAB)
    chosen = sample(logits, torch.zeros(3, 0, 4, dtype=torch.long), settings(3, top_k=1), 0, EOS, no_eos_block(3))
    assert torch.equal(chosen, logits.argmax(-1))


def test_a_row_draws_the_same_token_whatever_its_batch_mates():
    logits = torch.randn(3, 4, VOCAB)
    history = torch.zeros(3, 0, 4, dtype=torch.long)
    together = sample(logits, history, settings(3, seeds=[5, 6, 7]), 2, EOS, no_eos_block(3))
    alone = sample(logits[1:2], history[1:2], settings(1, seeds=[6]), 2, EOS, no_eos_block(1))
    assert torch.equal(together[1], alone[0])


def test_draws_follow_the_distribution():
    logits = torch.log(torch.tensor([0.7, 0.2, 0.1] + [1e-9] * (VOCAB - 3))).expand(4000, 1, VOCAB).clone()
    chosen = sample(logits, torch.zeros(4000, 0, 1, dtype=torch.long), settings(4000), 0, EOS, no_eos_block(4000))
    frequencies = torch.bincount(chosen.flatten(), minlength=3)[:3] / 4000
    assert torch.allclose(frequencies, torch.tensor([0.7, 0.2, 0.1]), atol=0.03)


def test_top_p_keeps_only_the_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2] + [1e-9] * (VOCAB - 3))).expand(500, 1, VOCAB).clone()
    chosen = sample(
        logits, torch.zeros(500, 0, 1, dtype=torch.long), settings(500, top_p=0.6), 0, EOS, no_eos_block(500)
    )
    assert set(chosen.flatten().tolist()) <= {0, 1}


def test_blocked_rows_never_draw_eos():
    logits = torch.full((2, 4, VOCAB), -10.0)
    logits[..., EOS] = 10.0
    chosen = sample(
        logits, torch.zeros(2, 0, 4, dtype=torch.long), settings(2, top_k=1), 0, EOS, torch.tensor([True, False])
    )
    assert not chosen[0].eq(EOS).any() and chosen[1].eq(EOS).all()


def test_repetition_penalty_discourages_recent_tokens():
    logits = torch.zeros(1, 1, VOCAB)
    logits[..., 3] = 1.0
    logits[..., 4] = 0.9
    history = torch.full((1, 5, 1), 3, dtype=torch.long)
    chosen = sample(logits, history, settings(1, top_k=1, penalty=1.2), 5, EOS, no_eos_block(1))
    assert chosen.item() == 4
