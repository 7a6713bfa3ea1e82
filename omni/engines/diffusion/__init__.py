"""The diffusion engine: step-level denoising scheduler (engine.py)."""
