"""The recognisers, on real speech (espeak-ng), and which one the settings choose."""

import pytest
import torch
import torchaudio
from whisper.audio import log_mel_spectrogram, pad_or_trim
from whisper.tokenizer import get_tokenizer

from chattts_farm.settings import Settings, SettingsError
from worker.asr.backends import (
    Offline,
    Whisper,
    at_16k,
    load_backend,
    load_whisper,
    synthetic_whisper,
    text_tokens,
    token_limit,
    whisper_checkpoint,
)
from worker.asr.text import error_rate, normalise
from worker.audio import SAMPLE_RATE

CPU = torch.device("cpu")
SAID = "the weather today is cold and rainy with strong winds from the north"
OTHER = "my grandmother bakes bread on sunday mornings"
MAX_ERROR_RATE = Settings().asr_max_error_rate
MAX_BATCH = 4  # the most clips a test hands a recogniser at once


def heard_error_rate(backend, speech, expected):
    samples, rate = speech
    return error_rate(normalise(expected), normalise(backend.transcribe(samples, rate, expected)))


@pytest.fixture(scope="module")
def offline():
    return Offline()


def test_the_offline_backend_passes_the_right_text(offline, speak):
    assert heard_error_rate(offline, speak(SAID), SAID) <= MAX_ERROR_RATE


def test_the_offline_backend_flags_a_different_sentence(offline, speak):
    assert heard_error_rate(offline, speak(OTHER), SAID) > MAX_ERROR_RATE


def test_the_offline_backend_hears_numbers_as_the_words_said(offline, speak):
    assert (
        heard_error_rate(offline, speak("the train leaves at 42 minutes past"), "the train leaves at 42 minutes past")
        <= MAX_ERROR_RATE
    )


def test_the_offline_backend_hears_a_batch_as_it_hears_each_clip_alone(offline, speak):
    spoken = [SAID, OTHER, "the train leaves at 42 minutes past"]
    expected = [SAID, SAID, spoken[2]]  # the second clip says something else than expected
    clips = [speak(text) for text in spoken]
    rate = clips[0][1]
    alone = [offline.transcribe(samples, rate, text) for (samples, _), text in zip(clips, expected, strict=True)]
    assert offline.transcribe_batch([samples for samples, _ in clips], rate, expected) == alone
    assert heard_error_rate(offline, clips[1], SAID) > MAX_ERROR_RATE >= heard_error_rate(offline, clips[0], SAID)


def test_the_offline_backend_knows_english_alone(offline):
    assert offline.hears("Hello there.") and not offline.hears("你好，世界。")


@pytest.mark.skipif(
    not whisper_checkpoint("tiny").is_file(),
    reason="Whisper tiny's weights are not in Whisper's cache, and they are never downloaded (none can be here)",
)
def test_whisper_hears_the_right_text_and_flags_another(speak):
    whisper = Whisper(load_whisper("tiny", CPU), CPU, MAX_BATCH)
    assert heard_error_rate(whisper, speak(SAID), SAID) <= MAX_ERROR_RATE
    assert heard_error_rate(whisper, speak(OTHER), SAID) > MAX_ERROR_RATE


def test_auto_checks_nothing_on_synthetic_weights_and_off_checks_nothing_at_all():
    assert load_backend(Settings.from_env({}), synthetic=True, device=CPU, max_batch=MAX_BATCH) is None
    assert (
        load_backend(Settings.from_env({"CHATTTS_FARM_ASR": "off"}), synthetic=False, device=CPU, max_batch=MAX_BATCH)
        is None
    )


def test_auto_on_real_weights_uses_whisper_only_when_its_weights_are_there(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert load_backend(Settings.from_env({}), synthetic=False, device=CPU, max_batch=MAX_BATCH) is None


def test_offline_is_chosen_even_on_synthetic_weights():
    assert isinstance(
        load_backend(
            Settings.from_env({"CHATTTS_FARM_ASR": "offline"}), synthetic=True, device=CPU, max_batch=MAX_BATCH
        ),
        Offline,
    )


def test_whisper_without_its_weights_fails_naming_the_setting(tmp_path):
    settings = Settings.from_env(
        {"CHATTTS_FARM_ASR": "whisper", "CHATTTS_FARM_ASR_WHISPER_MODEL": str(tmp_path / "tiny.pt")}
    )
    with pytest.raises(SettingsError, match="CHATTTS_FARM_ASR_WHISPER_MODEL"):
        load_backend(settings, synthetic=False, device=CPU, max_batch=MAX_BATCH)


def test_a_whisper_model_is_a_name_in_whispers_cache_or_a_checkpoints_path(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert whisper_checkpoint("base") == tmp_path / "whisper" / "base.pt"
    assert whisper_checkpoint("/models/tiny.en.pt").as_posix() == "/models/tiny.en.pt"


def test_whisper_with_random_weights_hears_a_batch_as_each_clip_alone_as_long_as_each_text(speak):
    """Random weights (synthetic-tiny, Whisper tiny's architecture: no weights can be had here) hear
    garbage and never end a clip themselves: the stand-in ends each where its text would end, as real
    weights hearing it said right would."""
    settings = Settings.from_env({"CHATTTS_FARM_ASR": "whisper", "CHATTTS_FARM_ASR_WHISPER_MODEL": "synthetic-tiny"})
    whisper = load_backend(settings, synthetic=True, device=CPU, max_batch=MAX_BATCH)
    clips = [speak(SAID), speak(OTHER)]
    rate = clips[0][1]
    heard = whisper.transcribe_batch([samples for samples, _ in clips], rate, [SAID, OTHER])
    assert heard == [
        whisper.transcribe(samples, rate, text) for (samples, _), text in zip(clips, [SAID, OTHER], strict=True)
    ]
    tokenizer = get_tokenizer(True, language="en", task="transcribe")
    for text, said in zip(heard, [SAID, OTHER], strict=True):
        # Decoding and encoding again need not give back the same tokens: within twice the text's.
        assert 0 < len(tokenizer.encoding.encode(text, allowed_special="all")) <= 2 * text_tokens(tokenizer, said)


@pytest.mark.parametrize("language", ["en", "zh"])
@pytest.mark.parametrize("text", [SAID, "Say <|endoftext|> and <|notimestamps|>, 3 times!", "你好，我有12个苹果。"])
def test_a_texts_tokens_are_those_whispers_tokenizer_encodes_from_it_normalised(language, text):
    tokenizer = get_tokenizer(True, language=language, task="transcribe")
    assert text_tokens(tokenizer, text) == len(tokenizer.encode(normalise(text)))


def test_whisper_with_random_weights_runs_each_clip_to_its_texts_limit_when_told_not_to_end_it_with_the_text(speak):
    """A benchmark's worst case: every segment heard as garbage that goes on."""
    settings = Settings.from_env({"CHATTTS_FARM_ASR": "whisper", "CHATTTS_FARM_ASR_WHISPER_MODEL": "synthetic-tiny"})
    whisper = load_backend(settings, synthetic=True, device=CPU, max_batch=MAX_BATCH)
    samples, rate = speak(SAID)
    ending = whisper.transcribe(samples, rate, SAID)
    whisper.ends_with_text = False
    running_on = whisper.transcribe(samples, rate, SAID)
    tokenizer = get_tokenizer(True, language="en", task="transcribe")
    assert running_on.startswith(ending)
    assert len(running_on) > 1.5 * len(ending)
    assert len(tokenizer.encoding.encode(running_on, allowed_special="all")) <= 2 * token_limit(tokenizer, SAID)


def test_whisper_loads_frozen():
    assert not any(weight.requires_grad for weight in load_whisper("synthetic-tiny", CPU).parameters())


def test_random_weights_are_used_only_when_asked_for_outright():
    settings = Settings.from_env({"CHATTTS_FARM_ASR_WHISPER_MODEL": "synthetic-tiny"})
    assert load_backend(settings, synthetic=False, device=CPU, max_batch=MAX_BATCH) is None  # auto


def test_random_whisper_weights_have_tinys_architecture_are_finite_and_the_same_each_time():
    first, second = synthetic_whisper("synthetic-tiny"), synthetic_whisper("synthetic-tiny")
    assert (first.dims.n_audio_state, first.dims.n_audio_layer, first.dims.n_text_head, first.dims.n_vocab) == (
        384,
        4,
        6,
        51865,
    )
    for (name, weight), again in zip(first.state_dict().items(), second.state_dict().values(), strict=True):
        assert torch.isfinite(weight).all() and torch.equal(weight, again), name


def test_whispers_spectrograms_of_a_batch_are_each_clips_alone_as_whisper_makes_them(speak):
    """Made at once on the model's device, padded to Whisper's window, each scaled by its own loudest value."""
    settings = Settings.from_env({"CHATTTS_FARM_ASR": "whisper", "CHATTTS_FARM_ASR_WHISPER_MODEL": "synthetic-tiny"})
    whisper = load_backend(settings, synthetic=True, device=CPU, max_batch=MAX_BATCH)
    loud, quiet = (at_rate(*speak(text), SAMPLE_RATE) for text in (SAID, OTHER))
    clips = [loud, 0.01 * quiet]
    batch = whisper.log_mels(clips, SAMPLE_RATE)
    assert batch.shape == (2, 80, 3000)
    for mine, clip in zip(batch, clips, strict=True):
        alone = log_mel_spectrogram(pad_or_trim(torch.from_numpy(at_16k(clip, SAMPLE_RATE))), 80)
        torch.testing.assert_close(mine, alone, atol=1e-4, rtol=0)  # float rounding: log10 of sums


def at_rate(samples, rate, new_rate):
    return torchaudio.functional.resample(torch.from_numpy(samples), rate, new_rate).numpy()
