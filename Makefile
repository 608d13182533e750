# Each target is one step; `make help` lists them.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: help setup tools demo test test-fast check generate clean image image-lock docker-image release chart-package version gpu-check

help:
	@echo "make demo      set up, then watch a starved training job through exporter, Prometheus and Alertmanager (KEEP=1: keep them running)"
	@echo "make test      set up, then run every test (real promtool / prometheus / amtool) and list the 30 slowest"
	@echo "make test-fast the unit, doctest and promtool tiers in parallel (about 3 CPU-minutes): run it before each commit;"
	@echo "               it leaves out the tiers marked live (Prometheus, Alertmanager, VictoriaMetrics), helm,"
	@echo "               browser (Chromium, node), hta (Holistic Trace Analysis), torch (training a model)"
	@echo "               and slow (the wheel and the image, load tests, GiB inputs, long replays), which make test runs"
	@echo "make generate  rewrite every generated artifact (rules/, docs/, alerting/, dashboards/, helm/)"
	@echo "make image     build the exporter's OCI image into build/image/ (Debian's python3 + the wheel; needs root)"
	@echo "make release   the wheel, sdist, image and packaged chart (trainprof-VERSION.tgz + index.yaml) in build/release/"
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

# KEEP=1 leaves the demo's Prometheus, Alertmanager and exporter running until Ctrl-C.
demo: setup
	$(PY) -m trainprof.demo $(if $(KEEP),--keep)

test: setup
	TRAINPROF_REQUIRE_TOOLS=$${TRAINPROF_REQUIRE_TOOLS:-1} $(PY) -m pytest --durations=30

# The tiers are markers tests/conftest.py sets from the fixtures each test uses. --dist
# loadgroup keeps each scenario file's cases on one worker, so it runs in one promtool process.
# Compiled modules are kept (__pycache__, as Python does by default) even where
# PYTHONDONTWRITEBYTECODE is set: each worker imports every test module, rewritten by pytest.
# One worker more than cores: a few tests wait on real time (a training process recording,
# a timeout running out), and the extra worker has the core meanwhile.
JOBS ?= $(shell n=$$(nproc 2>/dev/null) && echo $$((n + 1)) || echo auto)
FAST := not (live or helm or browser or hta or torch or slow)
PYCACHE := PYTHONDONTWRITEBYTECODE=

test-fast: setup
	TRAINPROF_REQUIRE_TOOLS=$${TRAINPROF_REQUIRE_TOOLS:-1} $(PYCACHE) $(PY) -m pytest -q -n $(JOBS) \
	  --dist loadgroup -m "$(FAST)"

generate: $(VENV)/.installed
	$(PY) -m trainprof.generation.generate

check: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m trainprof.generation.generate --check
	promtool check rules rules/trainprof.rules.yaml rules/trainprof.sources.rules.yaml
	amtool check-config alerting/alertmanager.example.yml
	$(VENV)/bin/actionlint .github/workflows/*.yml
	HELM_CACHE_HOME=$$(mktemp -d) HELM_CONFIG_HOME=$$(mktemp -d) HELM_DATA_HOME=$$(mktemp -d) \
	  $$(command -v helm || echo .tools/helm/helm) lint --strict helm/trainprof

version:
	@sed -n 's/^__version__ = "\(.*\)"/\1/p' src/trainprof/_version.py

# The exporter image without a registry: mmdebstrap + umoci (scripts/build_image.py).
# BUILD_PY: a Python with pip and setuptools (the release workflow's, without the test venv).
BUILD_PY ?= $(PY)

image:
	@[ -x "$(BUILD_PY)" ] || $(MAKE) $(VENV)/.installed
	@command -v mmdebstrap >/dev/null && command -v umoci >/dev/null || scripts/install-tools.sh
	$(BUILD_PY) scripts/build_image.py

# Re-resolve the image's Debian and Python packages (after a Debian security update).
image-lock: $(VENV)/.installed
	$(PY) scripts/build_image.py --relock

# What a release publishes, in $(RELEASE_DIR): the wheel and sdist, the image as an OCI
# archive, the packaged chart and its chart-repository index (.github/workflows/release.yml
# publishes them on a tag). CHART_URL is where the index says the chart file lives.
RELEASE_DIR ?= build/release
HELM ?= $$(command -v helm || echo .tools/helm/helm)
VERSION = $$(sed -n 's/^__version__ = "\(.*\)"/\1/p' src/trainprof/_version.py)
CHART_URL ?= https://github.com/trainprof/trainprof/releases/download/v$(VERSION)
HELM_HOMES = HELM_CACHE_HOME=$$(mktemp -d) HELM_CONFIG_HOME=$$(mktemp -d) HELM_DATA_HOME=$$(mktemp -d)

# IMAGE_REPOSITORY: where the release pushes the image; the packaged chart's values point
# there (helm/trainprof itself keeps trainprof/exporter, the name `make image` gives it).
IMAGE_REPOSITORY ?= trainprof/exporter

chart-package:
	mkdir -p $(RELEASE_DIR)
	rm -rf build/chart && mkdir -p build/chart && cp -r helm/trainprof build/chart/
	sed -i 's|^\(    repository: \)trainprof/exporter\b|\1$(IMAGE_REPOSITORY)|' build/chart/trainprof/values.yaml
	$(HELM_HOMES) $(HELM) package build/chart/trainprof -d $(RELEASE_DIR)
	$(HELM_HOMES) $(HELM) repo index $(RELEASE_DIR) --url $(CHART_URL)

release: image chart-package
	$(BUILD_PY) -m pip wheel --quiet --no-deps --no-build-isolation -w $(RELEASE_DIR) .
	$(BUILD_PY) -c "from setuptools import build_meta; build_meta.build_sdist('$(RELEASE_DIR)')" >/dev/null
	cp build/image/trainprof-exporter-$(VERSION).oci.tar $(RELEASE_DIR)/
	cd $(RELEASE_DIR) && sha256sum trainprof-* > SHA256SUMS && ls -l

# The same image for users with Docker, with the same tag.
docker-image:
	docker build -f exporter/Dockerfile --build-arg VERSION=$(VERSION) -t trainprof/exporter:$(VERSION) .

clean:
	rm -rf $(VENV) out build src/*.egg-info
