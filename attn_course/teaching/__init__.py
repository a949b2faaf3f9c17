"""What the chapters show around the code: sources, tables, plots, widgets, diagrams and small experiments (the
models they train live in :mod:`attn_course.models`). Nothing of the attention itself imports from here."""
