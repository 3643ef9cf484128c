"""State dicts as safetensors objects: ``AsyncCheckpointer.save_state`` / ``load_state``."""

from __future__ import annotations

from .results import STAGING_MODES, StagedSave, StagingMode, StateLoadResult, StateSaveResult

__all__ = ["STAGING_MODES", "StagedSave", "StagingMode", "StateLoadResult", "StateSaveResult"]
