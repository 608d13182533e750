# Each target is one step; `make help` lists them.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: help setup tools demo test check generate clean gpu-check

help:
	@echo "make demo      set up, then watch a starved training job through exporter, Prometheus and Alertmanager"
	@echo "make test      set up, then run every test (real promtool / prometheus / amtool)"
	@echo "make generate  rewrite every generated artifact (rules/, docs/, alerting/, dashboards/, helm/)"
	@echo "make check     fail on a lint or format finding in the Python files, a type finding in src/, a drifted generated artifact, an invalid rule file or a helm lint finding"
	@echo "make gpu-check on an NVIDIA GPU: the exporter against nvidia-smi, the training overheads, a kernel trace against HTA (GPU_PY=python with torch+CUDA)"

# torch is named in the same pip command as the extras so nothing they pull in can replace
# it: 2.13.0 is the CPU wheel on this machine's disk; an unpinned torch is a multi-GB CUDA build.
TORCH ?= torch==2.13.0

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e '.[test]' '$(TORCH)'
	touch $@

setup: $(VENV)/.installed tools

tools:
	@scripts/install-tools.sh

# The venv's torch is the CPU wheel: on a GPU machine point GPU_PY at a Python whose torch has
# CUDA and which has trainprof installed (pip install -e '.[all]').
GPU_PY ?= $(PY)

gpu-check: $(VENV)/.installed
	$(GPU_PY) benchmarks/gpu_check.py

demo: setup
	$(PY) -m trainprof.demo

test: setup
	TRAINPROF_REQUIRE_TOOLS=$${TRAINPROF_REQUIRE_TOOLS:-1} $(PY) -m pytest

generate: $(VENV)/.installed
	$(PY) -m trainprof.generation.generate

check: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m trainprof.generation.generate --check
	promtool check rules rules/trainprof.rules.yaml rules/trainprof.sources.rules.yaml
	amtool check-config alerting/alertmanager.example.yml
	HELM_CACHE_HOME=$$(mktemp -d) HELM_CONFIG_HOME=$$(mktemp -d) HELM_DATA_HOME=$$(mktemp -d) \
	  $$(command -v helm || echo .tools/helm/helm) lint --strict helm/trainprof

clean:
	rm -rf $(VENV) out build src/*.egg-info
