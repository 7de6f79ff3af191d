"""Settings come from CHATTTS_FARM_* variables, with typed defaults; the docs are generated from them."""

import logging
from pathlib import Path

import pytest

from chattts_farm.settings import Settings, SettingsError, documented
from cli.settings_docs import ENV_EXAMPLE_PATH, README_PATH, env_example, readme_with_table


def test_defaults_when_nothing_is_set():
    settings = Settings.from_env({})
    assert settings.model == "huggingface"
    assert settings.data_dir == Path("var")
    assert settings.max_text_chars == 5000
    assert settings.redis_url == "redis://localhost:6379/0"
    assert settings.matmul_dtype == "model"


def test_values_are_read_and_typed():
    settings = Settings.from_env(
        {
            "CHATTTS_FARM_MODEL": "synthetic-tiny",
            "CHATTTS_FARM_MAX_SEGMENTS_PER_PASS": "8",
            "CHATTTS_FARM_DATA_DIR": "/tmp/farm",
            "CHATTTS_FARM_REQUIRE_API_KEY": "yes",
            "CHATTTS_FARM_SEGMENT_PAUSE_S": "0.5",
            "CHATTTS_FARM_MATMUL_DTYPE": "fp8",
        }
    )
    assert (settings.model, settings.max_segments_per_pass, settings.data_dir) == (
        "synthetic-tiny",
        8,
        Path("/tmp/farm"),
    )
    assert settings.require_api_key is True and settings.segment_pause_s == 0.5
    assert settings.matmul_dtype == "fp8"


def test_overrides_win_and_none_means_not_given():
    settings = Settings.from_env({"CHATTTS_FARM_MODEL": "auto"}, model=None, max_segments_per_pass=3)
    assert (settings.model, settings.max_segments_per_pass) == ("auto", 3)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MAX_SEGMENTS_PER_PASS", "many"),
        ("MAX_SEGMENTS_PER_PASS", "0"),
        ("CUDA_DTYPE", "int8"),
        ("MATMUL_DTYPE", "bf16"),
        ("SEGMENT_PAUSE_S", "long"),
        ("REQUIRE_API_KEY", "maybe"),
    ],
)
def test_unusable_values_name_the_variable(name, value):
    with pytest.raises(SettingsError, match=f"CHATTTS_FARM_{name}"):
        Settings.from_env({f"CHATTTS_FARM_{name}": value})


def test_a_hard_limit_below_the_soft_limit_is_refused():
    with pytest.raises(SettingsError, match="TASK_TIME_LIMIT_S"):
        Settings.from_env({"CHATTTS_FARM_TASK_SOFT_TIME_LIMIT_S": "60", "CHATTTS_FARM_TASK_TIME_LIMIT_S": "30"})


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("MAX_BATCH", "MAX_SEGMENTS_PER_PASS", "max_segments_per_pass"),
        ("MAX_ROWS_PER_PASS", "MAX_SEGMENTS_PER_PASS", "max_segments_per_pass"),
        ("MAX_RUNNING_ROWS", "SLOTS", "slots"),
        ("BATCH_JOBS", "MAX_JOBS_IN_FLIGHT", "max_jobs_in_flight"),
    ],
)
def test_a_renamed_variable_is_still_read_under_its_old_name_with_a_warning(old, new, field, caplog):
    with caplog.at_level(logging.WARNING):
        settings = Settings.from_env({f"CHATTTS_FARM_{old}": "7"})
    assert getattr(settings, field) == 7
    assert f"CHATTTS_FARM_{old} is deprecated: call it CHATTTS_FARM_{new}" in caplog.text


def test_the_new_name_wins_over_the_old_one(caplog):
    with caplog.at_level(logging.WARNING):
        settings = Settings.from_env({"CHATTTS_FARM_MAX_BATCH": "7", "CHATTTS_FARM_MAX_SEGMENTS_PER_PASS": "9"})
    assert settings.max_segments_per_pass == 9 and "CHATTTS_FARM_MAX_BATCH is ignored" in caplog.text


def test_secrets_stay_out_of_the_settings_repr():
    settings = Settings.from_env({"CHATTTS_FARM_SECRET_KEY": "hush", "CHATTTS_FARM_FLOWER_AUTH": "ops:hush"})
    assert settings.secret_key == "hush" and "hush" not in repr(settings)


def test_the_readme_settings_table_is_the_generated_one():
    assert README_PATH.read_text() == readme_with_table(README_PATH.read_text()), (
        "the README's settings table is stale: run `python -m cli.settings_docs`"
    )


def test_env_example_is_the_generated_one_and_names_every_setting():
    text = ENV_EXAMPLE_PATH.read_text()
    assert text == env_example(), "`.env.example` is stale: run `python -m cli.settings_docs`"
    for variable, _default, _meaning, _field in documented():
        assert variable in text


@pytest.mark.parametrize("retries", [0, 2, 5])
def test_redis_never_hands_out_a_job_a_live_worker_may_still_hold(retries):
    # A live worker holds a job while one batch runs ahead of it, then for its own run and one more run
    # for each engine process death its retries allow, each bounded by the hard limit.
    settings = Settings.from_env({"CHATTTS_FARM_ENGINE_RETRIES": str(retries), "CHATTTS_FARM_TASK_TIME_LIMIT_S": "900"})
    longest_held_s = (2 + retries) * 900
    assert settings.visibility_timeout_s > longest_held_s
