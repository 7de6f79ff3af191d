"""Shared fixtures. Tests run on synthetic-tiny weights: the real ChatTTS weights cannot be had here."""

import os
from pathlib import Path

import pytest

from worker.settings import Settings


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """Where synthetic assets are built: CHATTTS_FARM_DATA_DIR when set, so runs can share one build."""
    configured = os.environ.get("CHATTTS_FARM_DATA_DIR")
    return Path(configured) if configured else tmp_path_factory.mktemp("farm-data")


@pytest.fixture(scope="session")
def tiny_settings(data_dir) -> Settings:
    return Settings.from_env({}, model="synthetic-tiny", device="cpu", data_dir=data_dir)
