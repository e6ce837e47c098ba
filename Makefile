# DDP Parity Lab. Two commands: `make lab` (set up, preflight, headline demo) and `make test` (set up, pytest,
# nbval, the notebooks in a real browser). Set-up never replaces an existing torch: a CUDA build on a GPU box is
# kept (see README "Set-up").
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
export OMP_NUM_THREADS ?= 1

.PHONY: lab test nbval setup lint notebooks strip bench clean

$(VENV)/.lab-installed: pyproject.toml
	@if [ ! -x $(PY) ]; then \
	  if $(PYTHON) -c "import torch" 2>/dev/null; then \
	    echo "setup: $(PYTHON) already has torch $$($(PYTHON) -c 'import torch; print(torch.__version__)'): the venv will reuse it"; \
	    $(PYTHON) -m venv --system-site-packages $(VENV); \
	  else \
	    $(PYTHON) -m venv $(VENV); \
	  fi; \
	fi
	@if $(PY) -c "import torch" 2>/dev/null; then \
	  echo "setup: keeping torch $$($(PY) -c 'import torch; print(torch.__version__)')"; \
	else \
	  echo "setup: installing $(TORCH_SPEC) $(TORCH_PIP_ARGS)"; \
	  $(PY) -m pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"; \
	fi
	$(PY) -m pip install -q -e ".[dev]"
	@touch $@

setup: $(VENV)/.lab-installed

lab: setup
	$(VENV)/bin/ddp-lab preflight
	$(VENV)/bin/ddp-lab demo

# Fast checks first (ruff, then pytest, slowest tests listed), then the browser step: it opens every chapter in
# JupyterLab in headless Chromium (Debian's /usr/bin/chromium, or $LAB_CHROMIUM), runs it from the menu, checks
# what a learner sees and compares each verdict cell with its committed output (what nbval-lax checks), so each
# notebook executes once. Screenshots go to build/screenshots/. Both steps run two at a time (pytest-xdist): a
# run's processes wait on each other (rendezvous, collectives, the hang tests' timeouts) and leave a core idle.
# --dist loadfile keeps a file's tests on one worker, so its module fixtures launch once. --timeout: a test stuck
# for 15 minutes fails with its stack (pytest-timeout) rather than holding CI until its limit; the slowest test
# takes about 1 minute here.
test: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest tests -q -n 2 --dist loadfile --durations=25 --timeout=900
	$(PY) -m pytest tests/browser/check_notebooks.py -q -n 2 --dist load --durations=0

# The notebooks under nbval, headless (a GPU box without Chromium): make nbval [NB=notebooks/01_unchanged.ipynb]
nbval: setup
	$(PY) -m pytest --nbval-lax --nbval-current-env $(or $(NB),notebooks) -q

lint: setup
	$(VENV)/bin/ruff check .

notebooks: setup
	$(VENV)/bin/ddp-lab notebooks

# Re-execute one chapter and keep only its verdict output: make strip NB=notebooks/01_unchanged.ipynb
strip: setup
	cd $(dir $(NB)) && $(abspath $(PY)) -m lab_utils.nbbuild refresh $(notdir $(NB))

# docs/checklist.md is generated from every chapter's "What to change in your script" bullets
# (lab_utils/checklist.py); tests/test_checklist.py fails when the committed file is not what this writes.
.PHONY: checklist
checklist: setup
	$(PY) -m lab_utils.checklist

bench: setup
	$(VENV)/bin/ddp-lab bench launch --launches 200
	$(VENV)/bin/ddp-lab bench samplers

clean:
	rm -rf runs build
