"""Grading submitted notebooks: in a sandbox, with the scores computed outside it.

Finding and reading the submissions: :mod:`.collect`, :mod:`.reading`, and :mod:`.display` for what
is printed. Running one: :mod:`.sandbox` (bubblewrap and the limits), :mod:`.in_sandbox` (the program
inside), :mod:`.remote` (its deadlines), :mod:`.proc` (its processes' use), through data-only messages
(:mod:`.wire`) of a checked shape (:mod:`.replies`). Grading it: :mod:`.assignment` (a chapter's
tests and context), :mod:`.proxies` (its answers as the checks call them), :mod:`.grader` (a process
of its own, from :mod:`.forkserver`). Writing the results: :mod:`.report`.

``tools/grade.py`` (``make grade``) grades a class with these; INSTRUCTORS.md explains the threat model.
"""
