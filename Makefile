# netbench: set-up, demo, tests and benchmarks. Run as root on Debian 12.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
DOCS_STAMP := $(VENV)/.installed-docs
DEB_PACKAGES := iproute2 iptables iperf3 iputils-ping prometheus openssh-server sudo dataset-fashion-mnist
PYTHON ?= python3

.PHONY: install demo test test-fast test-kernel bench reset clean help dashboards docs

help:
	@echo "make install   Debian packages, .venv, pinned Python packages (what netbench needs to run)"
	@echo "make demo      netbench sweep --latency 1,10,100ms on the embedded testbed"
	@echo "make test      the whole test suite (needs root for namespace tests), the docs' examples and site included"
	@echo "make docs      the documentation site (docs/, mkdocs build --strict) into site/"
	@echo "make test-fast pure unit tests only (no root, no TensorFlow)"
	@echo "make test-kernel the netem backend on Debian's stock kernel under qemu (virtme-ng)"
	@echo "make bench     emulation fidelity, delay-engine ceiling, sweep-memory, apply-speed, TCP carry-over, sweep-efficiency, design-time and harness benchmarks"
	@echo "make dashboards regenerate grafana/dashboards; Prometheus + Grafana with docker compose"
	@echo "make reset     remove everything netbench recorded in its journal (netbench reset; --all-namespaces also takes other testbeds)"

install: $(STAMP)

# What a user needs to run netbench: netbench, TensorFlow (the demo, sweeps), the report's
# figures and Keras 2. The test tools and the docs toolchain are extras that make test, make
# test-fast and make docs add to this venv (below), so no user's install depends on them.
$(STAMP): setup.cfg pyproject.toml constraints.txt
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@$(PYTHON) -m venv --help >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# PyTorch (the torch extra) only where pip finds its CPU build without an index (a wheel in
	@# pip's find-links, e.g. /opt/wheels): an index would resolve torch to a CUDA build of several GB
	@if $(BIN)/pip install -q --disable-pip-version-check --dry-run --ignore-installed --no-index --no-deps \
			'torch==2.13.0+cpu' >/dev/null 2>&1; then extras=tf,report,torch; \
	else extras=tf,report; echo "torch==2.13.0+cpu is not on this machine's disk: installing without the torch extra (its tests will skip)"; fi; \
	echo "$(BIN)/pip install -c constraints.txt -e '.[$$extras]'"; \
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -e ".[$$extras]"
	# Keras 2 for model.fit under MultiWorkerMirroredStrategy (examples/keras_fit.py, tests/tf); --no-deps:
	# it requires the package 'tensorflow', whose wheel would overwrite tensorflow-cpu's with a CUDA build
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -c constraints.txt tf-keras==2.21.0
	touch $(STAMP)

# setup.cfg's extras that the tests and the docs need, added to make install's venv once (and
# again when the install is redone): the tests (make test, test-fast, test-kernel) need the test
# extra and the docs one (the docs tier builds the site; a unit test loads docs/hooks.py),
# make docs only the docs one
$(TEST_STAMP): $(STAMP)
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -e '.[test,docs]'
	touch $@

$(DOCS_STAMP): $(STAMP)
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -e '.[docs]'
	touch $@

demo: install
	$(BIN)/netbench sweep --latency 1,10,100ms

test: $(TEST_STAMP)
	$(BIN)/pytest -q -m 'not netem'

# the documentation site; warnings (a broken link, a page missing from the nav) fail it
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

test-fast: $(TEST_STAMP)
	$(BIN)/pytest -q tests/unit

# Regenerate the Grafana dashboards, then start Prometheus and Grafana (needs a Docker engine).
dashboards: install
	$(BIN)/python -m netbench.metrics.dashboards grafana/dashboards
	mkdir -p /run/netbench/targets
	docker compose -f grafana/docker-compose.yml up -d
	@echo "Grafana: http://localhost:3000  Prometheus: http://localhost:9090"

bench: install
	$(BIN)/python bench/fidelity.py
	$(BIN)/python bench/engine_ceiling.py
	$(BIN)/python bench/sweep_memory.py
	$(BIN)/python bench/apply_speed.py
	$(BIN)/python bench/tcp_carryover.py
	$(BIN)/python bench/sweep_efficiency.py --run
	$(BIN)/python bench/design_time.py
	$(BIN)/python bench/harness.py
	$(BIN)/python bench/controller_cost.py
	$(BIN)/python bench/frameworks.py
	$(BIN)/python bench/rootless.py

reset: install
	$(BIN)/netbench reset

clean:
	rm -rf $(VENV) build site *.egg-info .pytest_cache .hypothesis

# The netem backend on a real netem kernel: Debian's stock kernel booted under qemu with
# the host's filesystem (virtme-ng). This machine's own kernel has no sch_netem.
KERNEL_DEB_PACKAGES := qemu-system-x86 linux-image-amd64 busybox-static
# found when the recipe runs: on a fresh machine the image is installed by the recipe itself
KERNEL_IMAGE = $$(ls /boot/vmlinuz-*-amd64 | sort -V | tail -n 1)
KERNEL_RESULT := .kernel-test

test-kernel: $(TEST_STAMP)
	@missing=""; for p in $(KERNEL_DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -e '.[kernel]'
	rm -rf $(KERNEL_RESULT) && mkdir -p $(KERNEL_RESULT)
	@# through a pipe: qemu opens its stdout and stderr by path, as files, and would truncate a log
	@# they are written to (CI's), losing make test's output before it; the result is the rc file's
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/vng --run $(KERNEL_IMAGE) --disable-kvm --force-9p --memory 2G --cpus 2 \
		--rwdir $(CURDIR)/$(KERNEL_RESULT) --exec "cd $(CURDIR) && NETBENCH_REQUIRE_NETEM=1 \
		$(BIN)/pytest -q -p no:cacheprovider -o addopts=-ra tests/kernel/ \
		> $(KERNEL_RESULT)/log 2>&1; echo \$$? > $(KERNEL_RESULT)/rc" 2>&1 | cat
	@cat $(KERNEL_RESULT)/log
	@test "$$(cat $(KERNEL_RESULT)/rc 2>/dev/null)" = 0 || { echo "test-kernel: failed (see above)"; exit 1; }
