# Each target is one step; `make help` lists them.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: help setup tools demo test check generate clean

help:
	@echo "make demo      set up, then compile the default ProfilerReport rules and prove them with promtool"
	@echo "make test      set up, then run every test (real promtool / prometheus / amtool)"
	@echo "make generate  rewrite every generated artifact (rules/, docs/, dashboards/)"
	@echo "make check     fail if a generated artifact drifted or a rule file is invalid"

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

setup: $(VENV)/.installed tools

tools:
	@scripts/install-tools.sh

demo: setup
	$(PY) -m trainprof.demo

test: setup
	TRAINPROF_REQUIRE_TOOLS=$${TRAINPROF_REQUIRE_TOOLS:-1} $(PY) -m pytest

generate: $(VENV)/.installed
	$(PY) -m trainprof.generate

check: setup
	$(PY) -m trainprof.generate --check
	promtool check rules rules/trainprof.rules.yaml

clean:
	rm -rf $(VENV) out build src/*.egg-info
