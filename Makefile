# Set-up and checks. Every target installs what it needs first, so each works on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup node-setup demo test test-unit bench bench-shards bench-traffic chaos lint typecheck docs wheel-check config check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Python packages (editable) and the kube-apiserver + etcd the tests run, built from Go modules;
# promtool, for the chart's alert rules, from Debian's prometheus package (hack/install-promtool.sh);
# Debian's haproxy for the haproxy adapter's tests (hack/install-haproxy.sh), each when missing.
setup: $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	hack/build-controlplane.sh >/dev/null
	hack/install-promtool.sh
	hack/install-haproxy.sh

# The real-node tier (docs/testing.md, "A real node"): its Debian packages (root), then its
# images (pause, the HTTP test server, the manager's), made again only when their inputs changed.
# setup has built the kubelet and kube-proxy beside the control plane.
node-setup: setup
	hack/install-node-packages.sh
	hack/build-node-images.sh >/dev/null

demo: setup
	$(BIN)/resourceconsist demo

# The whole suite, the real-node tier included (docs/testing.md, "A real node": it needs root,
# and installs its Debian packages and makes its images first).
test: node-setup
	$(BIN)/pytest

# The fast part alone: every test that needs no kube-apiserver + etcd (tests/conftest.py marks
# the others `controlplane`); `pytest tests/<area>` runs one area (README, "Tests").
test-unit: setup
	$(BIN)/pytest -m "not controlplane"

# bench_pace.py: the controller in its own process (docs/benchmarks.md), 1000 pods and a quick
# scale curve; PACE_ARGS="--go --rounds 3" adds the Go original (hack/build-go-original.sh),
# PACE_ARGS=--scale the curve to 10k pods (about half an hour).
bench: setup
	$(BIN)/python bench/bench_frame.py
	$(BIN)/python bench/bench_webhook.py
	$(BIN)/python bench/bench_rollout.py
	$(BIN)/python bench/bench_budget.py
	$(BIN)/python bench/bench_pace.py $(PACE_ARGS)

# Sharded replicas at scale (docs/benchmarks.md, "Sharded replicas"): 100 x 100 pods with 1, 2
# and 4 `run --sharding` processes; minutes, so neither in `make bench` nor in CI.
# SHARDS_ARGS="--services 1000 --pods 100" for the issue's 100k pods on a large machine.
bench-shards: setup
	$(BIN)/python bench/bench_shards.py $(SHARDS_ARGS)

# Rollouts behind a real HAProxy under 500 requests a second, counted request by request
# (docs/zero-downtime.md, "Measured under traffic"): a real node, so root and `make node-setup`;
# about an hour for every scenario 3 times, so neither in `make bench` nor in CI (the short
# version is tests/extensions/test_traffic_realnode.py). TRAFFIC_ARGS="--runs 1 --only roll".
bench-traffic: setup node-setup
	$(BIN)/python bench/bench_traffic.py $(TRAFFIC_ARGS)

# The guard under kill -9, provider faults, leader kills and SIGTERM (docs/chaos.md); minutes,
# so not in CI. `make chaos CHAOS_ARGS=--quick` for a short run.
chaos: setup
	$(BIN)/python bench/chaos.py $(CHAOS_ARGS)

# ruff, then the import contracts of .importlinter (the layers, docs/concepts.md "Layers"),
# checked on the package as it installs (the view package-view.sh makes).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	hack/package-view.sh build/importview
	cd build/importview && PYTHONPATH=. $(abspath $(BIN))/lint-imports --config $(CURDIR)/.importlinter

# mypy --strict over the package, then over the example adapter package (examples/) against the
# package as it installs (the view typecheck.sh made).
typecheck: setup
	PYTHON=$(abspath $(BIN)/python) hack/typecheck.sh
	MYPYPATH=build/typeview $(BIN)/mypy --config-file pyproject.toml examples/nginx-upstream/src

# The reference documentation (docs/, mkdocs.yml) built from the docstrings into site/;
# --strict turns every warning (a broken link, an unknown name) into a failure.
docs: setup
	$(BIN)/python -m pip install --quiet -e '.[dev,docs]'
	rm -rf build/docs-package
	$(BIN)/python -m pip install --quiet --no-deps --no-compile --target build/docs-package .
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The sdist and the wheel through the standard build frontend (`python -m build`), the wheel
# installed (not editable) into a fresh virtualenv and checked from outside the checkout: the
# command, the pytest plugin and the testing kit on a real control plane (docs/install.md).
wheel-check: setup
	PYTHON=$(abspath $(BIN)/python) hack/wheel-check.sh

# config/ (the kustomize install) rewritten from the Helm chart's default rendering; a test
# fails when the committed config/ differs (docs/install.md).
config: setup
	hack/generate-config.sh

check: lint typecheck test

clean:
	rm -rf $(VENV) $(VENV)-3.* build site
