"""The optional vllm backend for text-only AR stages."""
