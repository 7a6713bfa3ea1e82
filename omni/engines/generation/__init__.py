"""The generation engine: batched non-AR execution, chunk-aligned streaming."""
