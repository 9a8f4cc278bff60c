# Set-up and checks. Every target installs what it needs first, so each works on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test bench lint typecheck check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Python packages (editable) and the kube-apiserver + etcd the tests run, built from Go modules.
setup: $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	hack/build-controlplane.sh >/dev/null

demo: setup
	$(BIN)/resourceconsist demo

test: setup
	$(BIN)/pytest

bench: setup
	$(BIN)/python bench/bench_frame.py
	$(BIN)/python bench/bench_webhook.py

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	PYTHON=$(abspath $(BIN)/python) hack/typecheck.sh

check: lint typecheck test

clean:
	rm -rf $(VENV) build
