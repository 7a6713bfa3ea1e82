"""The autoregressive engine: continuous batching over a paged KV cache (engine.py)."""
