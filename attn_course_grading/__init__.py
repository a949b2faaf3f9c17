"""Grading submitted notebooks: in a sandbox, with the scores computed outside it.

- :mod:`~attn_course_grading.collect`: finding the submissions in a folder of student folders.
- :mod:`~attn_course_grading.reading`: reading one notebook safely (no link followed, caps).
- :mod:`~attn_course_grading.display`: text from a submission escaped before it is printed.
- :mod:`~attn_course_grading.wire`: the data-only messages between a submission and the grader.
- :mod:`~attn_course_grading.replies`: the shape every reply must have, its strings made safe.
- :mod:`~attn_course_grading.in_sandbox`: the program a submission runs in.
- :mod:`~attn_course_grading.sandbox`: the bubblewrap command line and the limits.
- :mod:`~attn_course_grading.proc`: what a sandbox's processes use, read from ``/proc``.
- :mod:`~attn_course_grading.remote`: a running submission, with deadlines on every read and write.
- :mod:`~attn_course_grading.proxies`: its answers as proxies the grader's checks call.
- :mod:`~attn_course_grading.assignment`: one chapter's tests, answers, imports and context.
- :mod:`~attn_course_grading.forkserver`: the fork server every grading process starts from.
- :mod:`~attn_course_grading.grader`: one chapter's tests against one submission, in a process of its own.
- :mod:`~attn_course_grading.report`: feedback files, ``grades.csv`` and console lines, safe to write.

``tools/grade.py`` (``make grade``) grades a class with these; INSTRUCTORS.md explains the threat
model.
"""
