"""Bindings: a framework's own parameters (Megatron-core, vLLM, Hugging Face names) as the views a refit
reads and writes, derived from the side's layout (docs/bindings.md)."""
