# Two commands for a new machine: `make run` (set up + serve) and `make test` (set up + test).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test lint bench setup clean schemathesis

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/librefang start

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python manage.py makemigrations --check --dry-run plugins_app >/dev/null
	$(BIN)/pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
