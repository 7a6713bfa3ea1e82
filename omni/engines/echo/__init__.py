"""The echo engine: speaks the real protocol, no model (tests and benchmarks)."""
