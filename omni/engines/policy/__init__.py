"""The policy engine: observation -> action chunk (engine.py)."""
