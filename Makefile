# Two commands: `make run` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-fast lint docs gpu-check clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "mellum-proxy needs Python >= 3.11")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[embedded,bench,dev,docs]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/mellum-proxy serve --embedded $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The edit-run loop: everything but the tests against the real llama.cpp server and the slow ones (markers).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not embedded and not slow" -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check mellum_proxy tests docs/hooks
	$(BIN)/ruff format --check mellum_proxy tests docs/hooks
	$(BIN)/mypy

# The docs site (mkdocs + Material) into site/; --strict: a broken link or a setting without its entry fails it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

gpu-check: $(STAMP)
	$(BIN)/python -m mellum_proxy.bench.runners.gpu_check

clean:
	rm -rf $(VENV) build site *.egg-info .pytest_cache .ruff_cache
