# attn-course: `make lab` to study, `make test` to check everything.
# Both build .venv on first use; nothing is installed or registered outside it.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch is installed first, alone, pinned and from PyTorch's own CPU index: PyPI's Linux torch is the
# CUDA build (several GB), and a student needs the CPU one (about 0.75 GB; the same index serves macOS
# and Windows). A CUDA GPU: TORCH_INDEX=https://download.pytorch.org/whl/cu128 (or TORCH_INDEX= for
# PyPI's build); a package mirror that holds the CPU build: TORCH_INDEX= takes torch from pip's own index.
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# The .venv's kernelspec comes first, ahead of any user-level "python3" kernel.
export JUPYTER_PATH := $(CURDIR)/$(VENV)/share/jupyter
# Keep runs offline and reproducible.
export HF_HUB_OFFLINE := 1
export PYTHONHASHSEED := 0
# Python writes each module's bytecode (__pycache__/) as it does by default, even where the environment says
# not to (PYTHONDONTWRITEBYTECODE, set on this course's 2-core test machine): without it every process compiled
# the course again, and pytest rewrote every test module's asserts again (collecting every test took 31 s of CPU
# instead of 21 s, in each worker). __pycache__/ is in .gitignore.
unexport PYTHONDONTWRITEBYTECODE
# OpenMP threads that wait for work sleep instead of spinning. The tests run two workers on two
# cores, each with its own kernels and subprocesses of two threads: spinning threads took the cores
# from the ones with work (a float64 training test took 237 s in the suite, 22 s alone; the whole
# suite 17 min 46 s against 10 min 27 s with this). It changes no result, only how idle threads wait.
export OMP_WAIT_POLICY ?= PASSIVE
# MKL, PyTorch's matrix products on x86, takes another code path on another CPU, and its round-off
# then grows through a training run. Its AVX2 path (conditional numerical reproducibility) gives the
# same products on every x86 CPU with AVX2. ATen's own vectorised kernels still differ (AVX2, AVX-512):
# chapters print a live training's numbers only within a band and analyse committed weights, and
# `make test-other-cpu-path` checks that on another ATen path.
export MKL_CBWR ?= AVX2

# The .venv in steps, each with its stamp: created (Python, venv and pip: made whole or removed, so a
# failed first build leaves nothing half-made), the course (the package, JupyterLab and otter: what a
# student needs), then each tool's extra (test, site, hub) on top, installed by the targets that use it.
CREATED := $(VENV)/.created
COURSE  := $(VENV)/.installed-course
TOOLS   := $(VENV)/.installed-tools
COMPILED := $(VENV)/.compiled
# The notebook kernel is this .venv's Python, registered inside .venv only, under the display
# name the chapters carry (tools/run_notebooks.py writes it when re-executing them, and
# `ipykernel install` gives it by default on conda and Binder). Under any other name JupyterLab
# rewrites a chapter's metadata as it opens, and then asks to save changes nobody made.
KERNEL := $(VENV)/share/jupyter/kernels/python3/kernel.json
KERNEL_DISPLAY_NAME := Python 3 (ipykernel)
# JupyterLab settings for this course: never ask about, or fetch, the Jupyter news feed.
OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json
# The hub's proxy, configurable-http-proxy, from npm into deploy/jupyterhub/node_modules (never globally).
HUB_DIR := deploy/jupyterhub
PROXY := $(HUB_DIR)/node_modules/.attn-course-installed
PIP := $(BIN)/python -m pip install --quiet
PIP_REMOVE := $(BIN)/python -m pip uninstall --quiet --yes
PIP_FAILED := { echo "make: pip failed (above); fix what it says and run make again, which goes on from here (make clean starts over)"; exit 1; }

.PHONY: venv tools-venv lab test test-other-cpu-path lint unit notebooks execute assignments grade site clean hub \
	handout handout-link collect scheduler worker

# What a student needs (make lab); the instructors' grading runs on it too.
venv: $(COURSE) $(KERNEL) $(OVERRIDES)
# Everything: the tests, the website and the hub.
tools-venv: $(TOOLS) venv $(COMPILED) $(PROXY)

$(CREATED):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null || { \
		echo "make: the course needs Python 3.10 or newer; '$(PYTHON)' is $$($(PYTHON) --version 2>&1 || echo missing)."; \
		echo "      Install a newer one (python.org, or brew install python@3.12) and name it: make lab PYTHON=python3.12"; \
		exit 1; }
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV) && $(BIN)/python -m pip install --quiet --upgrade pip || { rm -rf $(VENV); \
		echo "make: could not create .venv with $(PYTHON) (Debian and Ubuntu: apt-get install python3-venv); nothing was kept"; \
		exit 1; }
	touch $@

# A student's install is kept small (README, "Before you start"): pip writes no bytecode (0.35 GB; Python
# writes it for each module a chapter imports), and two packages that others ask for but no chapter runs
# are removed again: playwright (otter's PDF export, through nbconvert[webpdf]) and sentence-transformers
# with scikit-learn and SciPy (the loader that comes with the all-MiniLM-L6-v2 weights; the course reads
# the weights itself). The tools' pip run (make test) keeps them, or installs them back.
NOT_FOR_STUDENTS := playwright sentence-transformers scikit-learn scipy
# And after every pip run, rfc3987-syntax (jupyter-events asks for jsonschema's format checkers): jsonschema
# imports it whenever it is installed, and it builds some 35 Lark parsers as it is imported, 1.4 s of every
# process that imports nbformat or JupyterLab (a JupyterLab server, each tool, and each `make grade` and its
# fork server). No schema that Jupyter or the course validates has an "iri" format, the one it checks;
# without it jsonschema leaves that format unchecked. (binder/postBuild removes it too.)
SLOW_TO_IMPORT := rfc3987-syntax
TORCH_INSTALL = $(PIP) --no-compile --no-deps --retries 2 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)" \
	|| $(PIP_FAILED)
$(COURSE): pyproject.toml $(CREATED)
	$(TORCH_INSTALL)
	$(PIP) --no-compile -e ".[notebooks]" || $(PIP_FAILED)
	$(PIP_REMOVE) $(NOT_FOR_STUDENTS) $(SLOW_TO_IMPORT)
	touch $@

$(VENV)/.installed-%: pyproject.toml $(COURSE)
	$(PIP) -e ".[notebooks,$*]" || $(PIP_FAILED)
	$(PIP_REMOVE) $(SLOW_TO_IMPORT)
	touch $@

# Every tool's extra in one pip run (each run re-resolves everything), the course's packages with them: the
# single extras' stamps too, and the course's. A first `make test` so resolves and installs once, not the course
# first and then again with the tools (which put back what the course had just removed). Bytecode: $(COMPILED).
$(TOOLS): pyproject.toml $(CREATED)
	$(TORCH_INSTALL)
	$(PIP) --no-compile -e ".[notebooks,test,site,hub,cluster]" || $(PIP_FAILED)
	$(PIP_REMOVE) $(SLOW_TO_IMPORT)
	touch $(COURSE) $(VENV)/.installed-test $(VENV)/.installed-site $(VENV)/.installed-hub $(VENV)/.installed-cluster $@

# Bytecode, written once where the course runs as someone who cannot write into .venv or the checkout: the
# grader's sandboxes (make grade, and the tests) and the hub's students. tools/write_bytecode.py imports what
# those processes import (a sixth of the modules installed: compiling every one took 29 s). A module edited
# since, or first imported later, is compiled again where it is imported.
$(COMPILED): $(COURSE) tools/write_bytecode.py
	$(BIN)/python tools/write_bytecode.py
	touch $@

# Re-registered when the Makefile changes, so an existing .venv picks up a new display name.
$(KERNEL): $(COURSE) Makefile
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 \
		--display-name "$(KERNEL_DISPLAY_NAME)" > /dev/null

$(OVERRIDES): tools/jupyterlab-overrides.json $(COURSE)
	mkdir -p $(dir $@)
	cp $< $@

# configurable-http-proxy at package-lock.json's versions (npm ci: nothing resolved anew), for the hub
# (deploy/jupyterhub/) and its test (tests/hub/). Without npm nothing else needs it: the hub test then
# skips, except in CI, where .ci/run installs npm first.
$(PROXY): $(HUB_DIR)/package.json $(HUB_DIR)/package-lock.json
	@if command -v npm > /dev/null 2>&1; then \
		echo "npm ci in $(HUB_DIR) (configurable-http-proxy)"; \
		cd $(HUB_DIR) && npm ci --no-audit --no-fund --loglevel=error > /dev/null && touch node_modules/.attn-course-installed; \
	else \
		echo "npm not found: no configurable-http-proxy, so the hub test (tests/hub/) will skip; install npm, then make hub"; \
	fi

# The student's own copies of the chapters, my-notebooks/ (tools/student_copies.py: blank exercises, built
# from notebooks/ the first time, refreshed where untouched, never overwritten once edited), in JupyterLab.
# Another folder: LAB_ROOT=notebooks (the worked solutions), LAB_ROOT=dist/student. JupyterLab's flags
# (offline: no update checks, no news, no extension catalogue) live in tools/lab.py, which the browser
# tests start the server with too. Extra options: LAB_ARGS=...
lab: venv
	$(BIN)/python tools/lab.py $(if $(LAB_ROOT),--root "$(LAB_ROOT)") $(LAB_ARGS)

# ruff, then the layers: import-linter's contracts in pyproject.toml ([tool.importlinter]).
lint: tools-venv
	$(BIN)/ruff check attn_course attn_course_grading benchmarks gpu_tools tests tools notebooks deploy
	$(BIN)/lint-imports --no-cache --no-logo

# Every chapter re-run in this environment and compared, output by output, with the
# committed one; round-off in "max difference" lines is normalised (see the .cfg file).
NBVAL_FLAGS := --nbval --nbval-current-env --nbval-sanitize-with tests/course/nbval_sanitize.cfg

# pytest-xdist: one worker per core. --dist loadfile keeps each file on one worker: a chapter's
# cells share one kernel and run in order, and a test file's module fixtures are built once.
# (Session fixtures, e.g. conftest.py's `dist`, are built once per worker that needs them.) Files are handed
# out in collection order, the longest first (tests/conftest.py's LONG_FILES_FIRST), not by number of tests.
XDIST := -n auto --dist loadfile --no-loadscope-reorder

# The quick loop while editing (README says how long it takes): the tests and the docstrings'
# Examples (pyproject.toml's testpaths), but those marked slow (browser, otter grading, Triton's
# compiler, the real BERT).
unit: tools-venv
	$(BIN)/python -m pytest $(XDIST) -m "not slow"

notebooks: tools-venv
	$(BIN)/python -m pytest $(XDIST) $(NBVAL_FLAGS) notebooks

# What CI runs (.ci/run): lint, every test and Example, slow ones included, and every chapter. The run ends
# with its 25 slowest tests, setups included: what to look at first when make test nears its 15 minutes.
test: lint tools-venv
	$(BIN)/python -m pytest $(XDIST) --durations=25 $(NBVAL_FLAGS) tests attn_course attn_course_grading notebooks

# The chapters that train live, and the training tests, once more with ATen's vectorised kernels (softmax, layer
# norm, GELU, reductions) on another path than this CPU's own: AVX2 on an AVX-512 CPU, the scalar default on
# an AVX2 one (tools/other_cpu_path.py). Float32 training rounds differently there, as on another machine, so
# this fails where a printed number or a test depends on the last bits. .ci/run runs it after `make test`.
OTHER_CPU_PATH_CHAPTERS := $(addprefix notebooks/,04_causal.ipynb 08_transformer_bert.ipynb 09_modern_variants.ipynb \
	11_induction_heads.ipynb 12_open_models.ipynb)
test-other-cpu-path: tools-venv
	@other=$$(env -u ATEN_CPU_CAPABILITY $(BIN)/python tools/other_cpu_path.py) && echo "ATEN_CPU_CAPABILITY=$$other" && \
		ATEN_CPU_CAPABILITY=$$other $(BIN)/python -m pytest $(XDIST) $(NBVAL_FLAGS) tests/circuits tests/models tests/open_models \
		$(OTHER_CPU_PATH_CHAPTERS)

# Instructors (INSTRUCTORS.md): student notebooks + autograders into dist/ (CHAPTERS="02 05": some only), then grading, each
# notebook in a bubblewrap sandbox (TRUSTED=1: without one, for trusted submissions only;
# GRADE_ARGS="--seconds 300 --jobs 1": tools/grade.py's options, see INSTRUCTORS.md).
assignments: venv
	$(BIN)/python tools/assign.py --out dist $(CHAPTERS)

grade: venv $(COMPILED) $(if $(wildcard dist/autograder/*.zip),,assignments) $(if $(SCHEDULER),$(VENV)/.installed-cluster)
	@test -n "$(SUBMISSIONS)" || { echo "usage: make grade SUBMISSIONS=DIR (one folder per student) [SCHEDULER=tcp://host:8786]"; exit 2; }
	$(BIN)/python tools/grade.py "$(SUBMISSIONS)" --autograders dist/autograder --out grades \
		$(if $(filter-out 0,$(TRUSTED)),--trusted) $(if $(SCHEDULER),--scheduler "$(SCHEDULER)") $(GRADE_ARGS)

# A class graded on many machines (INSTRUCTORS.md section 5): `make scheduler` on one, `make worker
# SCHEDULER=tcp://THAT-HOST:8786` on each grading machine (as root, with bubblewrap), then `make grade
# SCHEDULER=...`. A worker grades JOBS notebooks at once (default: one per core); it is not daemonic, so
# that it may start the grading processes.
scheduler: venv $(VENV)/.installed-cluster
	$(BIN)/dask scheduler --port $(or $(PORT),8786) --no-dashboard

worker: venv $(COMPILED) $(VENV)/.installed-cluster
	@test -n "$(SCHEDULER)" || { echo "usage: make worker SCHEDULER=tcp://host:8786 [JOBS=N]"; exit 2; }
	DASK_DISTRIBUTED__WORKER__DAEMON=False $(BIN)/dask worker "$(SCHEDULER)" --nworkers 1 \
		--nthreads $(or $(JOBS),$$($(BIN)/python -c 'import os; print(os.cpu_count())')) --no-dashboard

# A class on JupyterHub (INSTRUCTORS.md section 6): the hub on this machine (deploy/jupyterhub/), the
# student notebooks committed into a git repository for nbgitpuller, the link that hands them out,
# and the students' notebooks gathered from the hub's homes into SUBMISSIONS for `make grade`.
HANDOUT_BRANCH ?= main
hub: venv $(VENV)/.installed-hub $(COMPILED) $(PROXY)
	$(BIN)/jupyterhub -f $(HUB_DIR)/jupyterhub_config.py $(HUB_ARGS)

handout: venv $(if $(wildcard dist/student/*.ipynb),,assignments)
	@test -n "$(HANDOUT_REPO)" || { echo "usage: make handout HANDOUT_REPO=DIR (the git repository students pull)"; exit 2; }
	$(BIN)/python tools/handout.py publish --student dist/student --repo "$(HANDOUT_REPO)" --branch "$(HANDOUT_BRANCH)"

handout-link: venv
	@test -n "$(HUB_URL)" && test -n "$(HANDOUT_URL)" || { echo "usage: make handout-link HUB_URL=https://hub.example.org HANDOUT_URL=GIT_URL [CHAPTER=02_formula]"; exit 2; }
	@$(BIN)/python tools/handout.py link --hub "$(HUB_URL)" --repo "$(HANDOUT_URL)" --branch "$(HANDOUT_BRANCH)" \
		$(if $(CHAPTER),--open "$(CHAPTER).ipynb")

collect: venv
	@test -n "$(HOMES)" || { echo "usage: make collect HOMES=/home [SUBMISSIONS=submissions] [CHAPTERS=02_formula,...]"; exit 2; }
	$(BIN)/python tools/collect_submissions.py "$(HOMES)" --out "$(or $(SUBMISSIONS),submissions)" \
		$(if $(CHAPTERS),--chapters "$(CHAPTERS)") $(COLLECT_ARGS)

# The course as a static website in build/site/ (README: "The course as a website"), built from
# the committed, executed chapters without running them; the students' version of the exercises.
site: venv $(VENV)/.installed-site
	$(BIN)/python tools/site.py --out build/site

# my-notebooks/ is the student's work: never removed by make.
clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache dist grades $(HUB_DIR)/node_modules

# Re-run every chapter in a fresh kernel and save it with outputs (after code changes).
execute: tools-venv
	$(BIN)/python tools/run_notebooks.py
