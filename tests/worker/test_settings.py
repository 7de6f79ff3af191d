"""Settings come from CHATTTS_FARM_* variables, with typed defaults."""

from pathlib import Path

import pytest

from worker.settings import Settings, SettingsError


def test_defaults_when_nothing_is_set():
    settings = Settings.from_env({})
    assert settings.model == "huggingface"
    assert settings.data_dir == Path("var")
    assert settings.max_text_chars == 5000
    assert settings.redis_url == "redis://localhost:6379/0"


def test_values_are_read_and_typed():
    settings = Settings.from_env({"CHATTTS_FARM_MODEL": "synthetic-tiny", "CHATTTS_FARM_MAX_BATCH": "8",
                                  "CHATTTS_FARM_DATA_DIR": "/tmp/farm"})
    assert (settings.model, settings.max_batch, settings.data_dir) == ("synthetic-tiny", 8, Path("/tmp/farm"))


def test_overrides_win_and_none_means_not_given():
    settings = Settings.from_env({"CHATTTS_FARM_MODEL": "auto"}, model=None, max_batch=3)
    assert (settings.model, settings.max_batch) == ("auto", 3)


@pytest.mark.parametrize(("name", "value"), [("MAX_BATCH", "many"), ("MAX_BATCH", "0"), ("CUDA_DTYPE", "int8"),
                                             ("SEGMENT_PAUSE_S", "long")])
def test_unusable_values_name_the_variable(name, value):
    with pytest.raises(SettingsError, match=f"CHATTTS_FARM_{name}"):
        Settings.from_env({f"CHATTTS_FARM_{name}": value})
