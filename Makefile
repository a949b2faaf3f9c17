# attn-course: `make lab` to study, `make test` to check everything.
# Both build .venv on first use; nothing is installed or registered outside it.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch is installed first and pinned so that pip takes the CPU wheel that lies on
# course machines instead of resolving a multi-GB CUDA build. On a GPU box, override:
#   make lab TORCH_SPEC=torch
TORCH_SPEC ?= torch==2.13.0
EXTRAS     ?= notebooks,grading,test
# The .venv's kernelspec comes first, ahead of any user-level "python3" kernel.
export JUPYTER_PATH := $(CURDIR)/$(VENV)/share/jupyter
# Keep runs offline and reproducible.
export HF_HUB_OFFLINE := 1
export PYTHONHASHSEED := 0

STAMP := $(VENV)/.installed
# JupyterLab settings for this course: never ask about, or fetch, the Jupyter news feed.
OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json

.PHONY: venv lab test lint unit notebooks execute assignments grade clean

venv: $(STAMP) $(OVERRIDES)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	# The notebook kernel is this .venv's Python, registered inside .venv only.
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 \
		--display-name "Python 3 (attn-course)" > /dev/null
	touch $(STAMP)

$(OVERRIDES): tools/jupyterlab-overrides.json $(STAMP)
	mkdir -p $(dir $@)
	cp $< $@

# Offline by design: no update checks, no news feed, no extension catalogue queries.
LAB_FLAGS := --ServerApp.root_dir=notebooks \
	--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate \
	--LabApp.news_url=None --LabApp.extension_manager=readonly \
	$(if $(filter 0,$(shell id -u)),--allow-root)

lab: venv
	$(BIN)/jupyter lab $(LAB_FLAGS) $(LAB_ARGS)

lint: venv
	$(BIN)/ruff check attn_course tests tools notebooks

unit: venv
	$(BIN)/python -m pytest tests

notebooks: venv
	$(BIN)/python -m pytest --nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg notebooks

test: lint venv
	$(BIN)/python -m pytest --nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg tests notebooks

# Instructors (INSTRUCTORS.md): student notebooks + autograders into dist/, then grading.
assignments: venv
	$(BIN)/python tools/assign.py --out dist

grade: venv $(if $(wildcard dist/autograder/*.zip),,assignments)
	@test -n "$(SUBMISSIONS)" || { echo "usage: make grade SUBMISSIONS=DIR (one folder per student)"; exit 2; }
	$(BIN)/python tools/grade.py "$(SUBMISSIONS)" --autograders dist/autograder --out grades

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache dist grades

# Re-run every chapter in a fresh kernel and save it with outputs (after code changes).
execute: venv
	$(BIN)/python tools/run_notebooks.py
