# netbench: set-up, demo, tests and benchmarks. Run as root on Debian 12.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEB_PACKAGES := iproute2 iptables iperf3 iputils-ping
PYTHON ?= python3

.PHONY: install demo test test-fast bench reset clean help

help:
	@echo "make install   Debian packages, .venv, pinned Python packages"
	@echo "make demo      netbench sweep --latency 1,10,100ms on the embedded testbed"
	@echo "make test      the whole test suite (needs root for namespace tests)"
	@echo "make test-fast pure unit tests only (no root, no TensorFlow)"
	@echo "make bench     emulation fidelity and delay-engine ceiling benchmarks"
	@echo "make reset     remove everything netbench made"

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml constraints.txt
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@$(PYTHON) -m venv --help >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -e '.[tf,test]'
	touch $(STAMP)

demo: install
	$(BIN)/netbench sweep --latency 1,10,100ms

test: install
	$(BIN)/pytest -q

test-fast: install
	$(BIN)/pytest -q -m "not root and not tf"

bench: install
	$(BIN)/python bench/fidelity.py
	$(BIN)/python bench/engine_ceiling.py

reset: install
	$(BIN)/netbench reset

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
