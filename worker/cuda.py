"""CUDA settings a process must make before torch first touches the GPU. Never imports torch."""

from __future__ import annotations

import os
from collections.abc import MutableMapping

ALLOCATOR_SETTING = "PYTORCH_CUDA_ALLOC_CONF"
# Expandable segments keep long-running workers from dying of fragmentation OOMs.
ALLOCATOR_DEFAULT = "expandable_segments:True"


def configure_allocator(environment: MutableMapping[str, str] = os.environ) -> None:
    """Set the caching allocator's configuration in ``environment`` unless the user already has."""
    environment.setdefault(ALLOCATOR_SETTING, ALLOCATOR_DEFAULT)
