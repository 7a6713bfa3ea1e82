"""omni: one serving runtime for omni-modality generation."""

from omni.config.presets import load_pipeline
from omni.runtime.async_omni import AsyncOmni, Omni
from omni.runtime.orchestrator import OmniOutput

__all__ = ["AsyncOmni", "Omni", "OmniOutput", "load_pipeline"]
__version__ = "0.1.0"
