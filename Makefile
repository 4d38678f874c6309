# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PLUGINS := plugins/coreml plugins/pytorch plugins/msl plugins/mpsgraph plugins/example-ops
EXTRAS := $(foreach p,$(PLUGINS),$(if $(wildcard $(p)/pyproject.toml),-e $(p)[test]))
PYTEST_ARGS ?=

.PHONY: install demo test test-all docs schema conformance bench clean browser

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(wildcard plugins/*/pyproject.toml) tests/testplugin/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch is pinned to the CPU build: an unpinned torch drags in several GB of CUDA packages
	$(BIN)/pip install -q -e '.[test]' $(EXTRAS) -e tests/testplugin
	touch $@

demo: install
	$(BIN)/edgebuild run recipes/orientation.yaml
	@echo
	@echo "artifacts: build/orientation/<variant>/model.mlpackage"
	@echo "reports:   build/orientation/<variant>/report.html"

test: install docs
	$(BIN)/pytest -n 2 -q $(PYTEST_ARGS)

test-all: install
	$(BIN)/pytest -n 2 -q -m '' $(PYTEST_ARGS)

docs: install
	$(BIN)/python -m edgebuild.docsgen
	$(BIN)/mkdocs build -q --strict -d build/site

schema: install
	$(BIN)/edgebuild schema --out schemas/recipe.schema.json

conformance: install
	$(BIN)/python -m edgebuild.conformance --suite onnx-node --backend coreml --out docs/conformance.md

bench: install
	$(BIN)/python benchmarks/cache.py

# headless Chromium for the report rendering test (Debian package; needs root)
browser:
	command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q chromium)

clean:
	rm -rf build $(VENV)
