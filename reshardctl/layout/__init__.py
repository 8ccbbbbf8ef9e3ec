"""Layouts: for every HF tensor, the index set (boxes) each trainer or inference rank holds."""
