"""What the chapters show around the code: sources, pictures, widgets, diagrams and small experiments.

- :mod:`~attn_course.teaching.source`: :func:`show_source`, a function's code without its input checks;
- :mod:`~attn_course.teaching.plots`: heatmaps and bar charts of attention weights;
- :mod:`~attn_course.teaching.widgets` and :mod:`~attn_course.teaching.head_view`: interactive views;
- :mod:`~attn_course.teaching.flash_diagrams`, :mod:`~attn_course.teaching.distributed_diagrams`:
  chapter 06's tiles and chapter 10's ring, drawn;
- :mod:`~attn_course.teaching.experiments`: the small training experiments chapters 02, 03 and 09 run.

Nothing of the attention itself imports from here.
"""
