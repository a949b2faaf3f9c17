"""What the chapters show around the code: sources, pictures, widgets, diagrams and small experiments.

- :mod:`~attn_course.teaching.source`: :func:`show_source`, a function's code for display;
- :mod:`~attn_course.teaching.tables`: :func:`table`, every table a chapter shows, as a DataFrame;
- :mod:`~attn_course.teaching.plots`: heatmaps and bar charts of attention weights;
- :mod:`~attn_course.teaching.widgets` and :mod:`~attn_course.teaching.head_view`: interactive views;
- :mod:`~attn_course.teaching.flash_diagrams`, :mod:`~attn_course.teaching.distributed_diagrams`:
  chapter 06's tiles and chapter 10's ring, drawn;
- :mod:`~attn_course.teaching.experiments`: the small experiments chapters 02, 03, 05 and 09 run
  (the models they train live in :mod:`attn_course.models`).

Nothing of the attention itself imports from here.
"""
