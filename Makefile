# Two commands: `make run` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint gpu-check clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "mellum-proxy needs Python >= 3.11")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[embedded,bench,dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/mellum-proxy serve --embedded $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check proxy bench tests
	$(BIN)/ruff format --check proxy bench tests
	$(BIN)/mypy

gpu-check: $(STAMP)
	$(BIN)/python -m bench.runners.gpu_check

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
