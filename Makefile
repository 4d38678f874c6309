# Two commands on a fresh machine: `make demo` and `make test`.
#   .venv       the user environment: edgebuild and its first-party plugins, as `pip install 'edgebuild[...]'`
#               would install them (`make demo`: the core and the Core ML backend only; `make install`: all)
#   .venv-test  the test environment: everything, the test extras and the test plugin (`make test`)
#   .venv-core  the core alone with its test extra and the test plugin, no backend: tests/ must pass
#               there (`make test-core`, part of `make test`)
#   .venv-build build, twine and the build backend only, for `make wheels`
# All three install the versions in constraints/newest.txt, the newest known to work (docs/start.md, Install).
PYTHON ?= python3
VENV ?= .venv
TEST_VENV ?= .venv-test
CORE_VENV ?= .venv-core
BUILD_VENV ?= .venv-build
BIN := $(VENV)/bin
TEST_BIN := $(TEST_VENV)/bin
CORE_BIN := $(CORE_VENV)/bin
BUILD_BIN := $(BUILD_VENV)/bin
CONSTRAINTS ?= constraints/newest.txt
PIP_INSTALL = pip install -q -c $(CONSTRAINTS)
# the first-party plugins the extras name, installed from this tree (pip takes a named folder over the index)
PLUGINS := plugins/coreml plugins/pytorch plugins/jax plugins/mpsgraph plugins/msl
TEST_PLUGINS := $(PLUGINS) plugins/example-ops
# every distribution a release publishes: the core and each plugin folder
DISTRIBUTIONS := . $(TEST_PLUGINS)
PYTEST_ARGS ?=
CORE_PYTEST_ARGS ?=

.PHONY: install demo test test-core test-all test-env docs docs-check schema conformance bench wheels clean browser cluster

$(VENV)/bin/pip:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(TEST_BIN)/pip:
	$(PYTHON) -m venv $(TEST_VENV)
	$(TEST_BIN)/pip install -q --upgrade pip

$(CORE_BIN)/pip:
	$(PYTHON) -m venv $(CORE_VENV)
	$(CORE_BIN)/pip install -q --upgrade pip

# what the demo needs: ONNX in, Core ML out (no torch, no test extras)
$(VENV)/.demo-installed: pyproject.toml plugins/coreml/pyproject.toml $(CONSTRAINTS) | $(VENV)/bin/pip
	$(BIN)/$(PIP_INSTALL) -e '.[coreml]' -e plugins/coreml
	touch $@

$(VENV)/.installed: pyproject.toml $(foreach p,$(PLUGINS),$(p)/pyproject.toml) $(CONSTRAINTS) | $(VENV)/bin/pip
	$(BIN)/$(PIP_INSTALL) -e '.[all]' $(foreach p,$(PLUGINS),-e $(p))
	touch $@

$(TEST_VENV)/.installed: pyproject.toml $(wildcard plugins/*/pyproject.toml) tests/testplugin/pyproject.toml $(CONSTRAINTS) | $(TEST_BIN)/pip
	$(TEST_BIN)/$(PIP_INSTALL) -e '.[all,test]' $(foreach p,$(TEST_PLUGINS),-e $(p)[test]) -e tests/testplugin
	# torchvision's model definitions for the architecture corpus, in a folder of their own: its wheel is a
	# CUDA build whose C ops the test plugin defines (edgebuild_testplugin.torchvision_models), and in
	# site-packages transformers would import it without them
	$(TEST_BIN)/pip install -q --no-deps --upgrade --target $(TEST_VENV)/torchvision-models torchvision==0.28.0
	touch $@

# no plugins/*: the core's tests run with no backend installed
$(CORE_VENV)/.installed: pyproject.toml tests/testplugin/pyproject.toml $(CONSTRAINTS) | $(CORE_BIN)/pip
	$(CORE_BIN)/$(PIP_INSTALL) -e '.[test]' -e tests/testplugin
	touch $@

install: $(VENV)/.installed

test-env: $(TEST_VENV)/.installed

demo: $(VENV)/.demo-installed
	$(BIN)/edgebuild run recipes/orientation.yaml
	@echo
	@echo "artifacts: build/orientation/<variant>/model.mlpackage"
	@echo "reports:   build/orientation/<variant>/report.html"

test: test-core test-env docs
	$(TEST_BIN)/lint-imports
	$(TEST_BIN)/pytest -n 2 -q $(PYTEST_ARGS)

# tests/ with the core alone: a test that needs a backend belongs in that plugin's tests/
test-core: $(CORE_VENV)/.installed
	$(CORE_BIN)/pytest -n 2 -q tests $(CORE_PYTEST_ARGS)

test-all: test-env
	$(TEST_BIN)/pytest -n 2 -q -m '' $(PYTEST_ARGS)

docs: test-env
	$(TEST_BIN)/python -m edgebuild.recipe.docsgen
	$(TEST_BIN)/mkdocs build -q --strict -d build/site

schema: test-env
	$(TEST_BIN)/edgebuild schema --out schemas/recipe.schema.json

conformance: test-env
	$(TEST_BIN)/edgebuild conformance --suite onnx-node --backend coreml --out docs/conformance.md
	$(TEST_BIN)/edgebuild conformance --suite stablehlo --backend coreml --out docs/conformance-stablehlo.md

bench: test-env
	$(TEST_BIN)/python benchmarks/cache.py

# a Dask scheduler on 127.0.0.1:$(CLUSTER_PORT) and two single-threaded worker processes that import
# the plugins as they start, in the foreground until Ctrl-C: `edgebuild run ... --executor
# dask://127.0.0.1:8786` (docs/distributed.md)
CLUSTER_PORT ?= 8786
cluster: test-env
	trap 'kill 0' INT TERM; \
	$(TEST_BIN)/dask scheduler --host 127.0.0.1 --port $(CLUSTER_PORT) --no-dashboard & \
	$(TEST_BIN)/dask worker tcp://127.0.0.1:$(CLUSTER_PORT) --host 127.0.0.1 --nworkers 2 --nthreads 1 --no-dashboard \
		--preload edgebuild.dag.dask_worker & \
	wait

$(BUILD_VENV)/.installed: $(CONSTRAINTS)
	$(PYTHON) -m venv $(BUILD_VENV)
	$(BUILD_BIN)/$(PIP_INSTALL) build twine setuptools
	touch $@

# an sdist and a wheel of the core and of every first-party plugin in dist/, as a release
# uploads them (.github/workflows/release.yml), checked by twine; no test environment needed.
# Install from them: pip install --find-links dist 'edgebuild[coreml]'
wheels: $(BUILD_VENV)/.installed
	rm -rf dist
	for d in $(DISTRIBUTIONS); do $(BUILD_BIN)/python -m build -q --no-isolation -o dist $$d || exit 1; done
	$(BUILD_BIN)/twine check --strict dist/*

# every code block of README.md and the guides run as written, each shell block from a fresh copy
# of the tree (tests/test_docs_blocks.py; blocks after a `<!-- fragment -->` line are only parsed)
docs-check: test-env
	$(TEST_BIN)/pytest -q -p no:xdist -m '' tests/test_docs_blocks.py

# headless Chromium for the report rendering test (Debian package; needs root)
browser:
	command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q chromium)

clean:
	rm -rf build dist $(VENV) $(TEST_VENV) $(CORE_VENV) $(BUILD_VENV)
