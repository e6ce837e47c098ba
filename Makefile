# DDP Parity Lab. Two commands: `make lab` (set up, preflight, headline demo) and `make test` (set up, pytest,
# nbval over every chapter, then what nbval executed in a real browser). Set-up never replaces an existing torch: a CUDA build on a GPU box is
# kept (see README "Set-up").
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
export OMP_NUM_THREADS ?= 1
# Set-up installs without byte-compiling (scripts/pip_install.py: uv, or pip); each module is compiled the first
# time a process imports it and kept. A box that sets PYTHONDONTWRITEBYTECODE (this project's CI box does) would
# otherwise compile torch again in every one of the hundreds of processes a test run starts (+2.5 s CPU each).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: lab test test-fast nbval setup lint notebooks strip bench clean

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
	  $(PY) scripts/pip_install.py $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"; \
	fi
	$(PY) scripts/pip_install.py -e ".[dev]"
	@touch $@

setup: $(VENV)/.lab-installed

lab: setup
	$(VENV)/bin/ddp-lab preflight
	$(VENV)/bin/ddp-lab demo

# ruff first; then one pytest session runs the tests and every chapter under nbval together (slowest listed); then
# the browser step. Each chapter is executed about once:
# - nbval runs every chapter headless on gloo (--nbval-lax: each verdict cell's table against its committed output,
#   after the sanitizers in notebooks/nbval_sanitize.cfg), as the series promises and as its users run it as a
#   regression suite. notebooks/conftest.py reports a failed verdict cell as the claims that changed, and, with
#   LAB_NBVAL_SAVE, keeps each chapter as nbval executed it (outputs and widget state) in build/executed/.
# - The browser step opens those executed copies in JupyterLab in headless Chromium (Debian's /usr/bin/chromium,
#   or $LAB_CHROMIUM) and checks what a learner sees without running them again: widgets drawn, progress bars
#   finished, plots loaded, no error output, no JavaScript error, every cell run. Running them again there would
#   double the time of the slowest step (on this project's 2-core CI box the browser pass alone took ~8.5 min).
#   Only 00_preflight, the chapter every learner runs first, is run again from the menu (LAB_BROWSER_LIVE), so the
#   live path (kernel, widget messages while cells run) stays tested; two canaries, a broken notebook run live and
#   run under nbval then rendered, must have every defect reported. Screenshots go to build/screenshots/.
# Why the tests and the chapters share one session, three at a time (pytest-xdist): the 2-core box is busy, but a
# run's processes also wait on each other (rendezvous, collectives, the hang tests' timeouts), and as two steps of
# two workers each step ended on one long file with a core idle. One session of three keeps both cores fed; the
# chapters come first so the longest files start early. The tests set their own LAB_RUNS_DIR (tests/conftest.py),
# so the chapters' one below applies to the chapters only. --dist loadfile keeps a file's tests on one worker, so
# its module fixtures launch once and a notebook's cells share one kernel. --timeout: a test stuck for 15 minutes
# fails with its stack (pytest-timeout) rather than holding CI until its limit; the slowest item takes ~1.5 min here.
NBVAL = $(PY) -m pytest --nbval-lax --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg \
	--nbval-cell-timeout 900
test: setup
	$(VENV)/bin/ruff check .
	rm -rf build/executed build/nbval-runs
	LAB_NBVAL_SAVE=$(CURDIR)/build/executed LAB_RUNS_DIR=$(CURDIR)/build/nbval-runs \
	  $(NBVAL) notebooks tests -q -n 3 --dist loadfile --durations=25 --timeout=900
	LAB_BROWSER_EXECUTED=$(CURDIR)/build/executed \
	  $(PY) -m pytest tests/browser/check_notebooks.py -q -n 2 --dist load --durations=0

# pytest without the tests marked slow (they start processes or take over ~2 s; tests/conftest.py): the
# edit-test loop, under a minute on the 2-core CI box. `make test` still runs every test.
test-fast: setup
	$(PY) -m pytest tests -q -m "not slow" --durations=10

# The chapters under nbval alone, headless (a GPU box without Chromium; docs/workshop.md "The day before"):
# make nbval [NB=notebooks/01_unchanged.ipynb]. Executed copies go to build/executed/ (open them in JupyterLab).
# NBVAL_WORKERS: notebooks at a time (default 2); NBVAL_ARGS: more pytest arguments (e.g. --junitxml=FILE).
nbval: setup
	rm -rf build/executed
	LAB_NBVAL_SAVE=$(CURDIR)/build/executed $(NBVAL) $(or $(NB),notebooks) -q -n $(or $(NBVAL_WORKERS),2) \
	  --dist loadfile --durations=15 $(NBVAL_ARGS)

lint: setup
	$(VENV)/bin/ruff check .

notebooks: setup
	$(VENV)/bin/ddp-lab notebooks

# Re-execute one chapter and keep only its verdict output: make strip NB=notebooks/01_unchanged.ipynb
strip: setup
	cd $(dir $(NB)) && $(abspath $(PY)) -m lab_utils.nbbuild refresh $(notdir $(NB))

# docs/checklist.md is generated from every chapter's "What to change in your script" bullets
# (lab_utils/checklist.py); tests/notebooks/test_checklist.py fails when the committed file is not what this writes.
.PHONY: checklist
checklist: setup
	$(PY) -m lab_utils.checklist

bench: setup
	$(VENV)/bin/ddp-lab bench launch --launches 200
	$(VENV)/bin/ddp-lab bench samplers

clean:
	rm -rf runs build
