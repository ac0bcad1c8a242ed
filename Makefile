# Two entry points, each doing its own set-up idempotently:
#   make demo   plan and run the quickstart job (the main job, on the embedded local backend)
#   make test   the whole test suite (unit, CLI, and real-Slurm tests)
#   make test-fast   the tests that start no process (about a minute): for iterations
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast sysdeps bench schema docs docs-serve clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test,report,submitit,docs]'
	# torch is pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet --disable-pip-version-check 'torch==2.13.0' numpy
	# The framework adapters' tests run the frameworks (torch is in place: nothing pulls another).
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[lightning,hf]'
	# Megatron-Core serves as the reference for rank groups (tests only).
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps 'megatron-core==0.16.1'
	# pyslurm (GPL-2.0, the optional fast query path) is not on the package index for Slurm 22.05:
	# the wheel beside the checkout, when there is one (CI has it; tests need it when CI is set).
	if ls ../shared/vendor/pyslurm/pyslurm-*.whl >/dev/null 2>&1; then \
	  $(BIN)/pip install --quiet --disable-pip-version-check ../shared/vendor/pyslurm/pyslurm-*.whl; fi
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/clusterctl plan examples/quickstart.yaml
	$(BIN)/clusterctl submit examples/quickstart.yaml --wait

# System tools the tests use: shellcheck for the rendered scripts, Slurm's
# client (scontrol) for the hostlist tests that compare with Slurm, and
# Debian's sshd for the ssh test servers (tests/sshlab), libslurm for pyslurm. Those run
# before the Slurm test cluster's tests start the cluster, so its install step
# (tests/slurmlab/lab.sh install: the Debian packages, idempotent) runs here,
# before any test. Without root it cannot; the comparisons are then skipped,
# or fail when CI is set.
sysdeps:
	@command -v shellcheck >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends shellcheck; } \
	  || echo "warning: could not install shellcheck; its tests will be skipped"
	@{ command -v scontrol >/dev/null && ldconfig -p 2>/dev/null | grep -q 'libslurm\.so'; } || bash tests/slurmlab/lab.sh install \
	  || echo "warning: could not install Slurm's packages; the tests that compare with scontrol will be skipped"
	@test -x /usr/sbin/sshd || { apt-get update -qq && apt-get install -y -qq --no-install-recommends openssh-server; } \
	  || echo "warning: could not install openssh-server; the ssh test servers' tests will be skipped"
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium; } \
	  || echo "warning: could not install chromium; the documentation's browser test will be skipped"
	@command -v bwrap >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends bubblewrap; } \
	  || echo "warning: could not install bubblewrap; the container tests will be skipped"

test: $(STAMP) sysdeps
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m unit

bench: $(STAMP)
	$(BIN)/python bench/plan_scale.py

# The documentation site into site/ (its reference pages generated from the code); docs-serve on 127.0.0.1:8000.
# (The two variables silence a notice a theme release prints about MkDocs' future; extras pin mkdocs<2.)
MKDOCS := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(BIN)/mkdocs
docs: $(STAMP)
	$(MKDOCS) build --strict

docs-serve: $(STAMP)
	$(MKDOCS) serve

schema: $(STAMP)
	$(BIN)/clusterctl schema > clusterctl/job.schema.json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis site
