"""Shared test setup: Triton's mode, a headless matplotlib and fast, repeatable hypothesis runs."""

import matplotlib

# Before anything imports Triton (transformers does): without a GPU, attn_course selects
# Triton's interpreter, which Triton only honours at its own import.
import attn_course  # noqa: F401, I001

# Before anything imports pyplot: tests draw figures without a display.
matplotlib.use("Agg")

from hypothesis import settings  # noqa: E402

# No example database: hypothesis would otherwise write .hypothesis/ into the checkout.
# Each property test still sets max_examples and deadline itself.
settings.register_profile("attn_course", database=None)
settings.load_profile("attn_course")
