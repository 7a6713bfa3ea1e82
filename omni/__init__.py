"""omni: one serving runtime for omni-modality generation."""

from omni.async_omni import AsyncOmni, Omni
from omni.orchestrator import OmniOutput
from omni.presets import load_pipeline

__all__ = ["AsyncOmni", "Omni", "OmniOutput", "load_pipeline"]
__version__ = "0.1.0"
