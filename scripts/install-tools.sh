#!/usr/bin/env bash
# Installs the real Prometheus tools the tests run: prometheus + promtool (2.42) and
# Alertmanager + amtool (0.25), from Debian. Does nothing when they are already on PATH.
set -euo pipefail

need=()
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v amtool >/dev/null 2>&1 && command -v prometheus-alertmanager >/dev/null 2>&1 \
  || need+=(prometheus-alertmanager)
command -v openssl >/dev/null 2>&1 || need+=(openssl)   # the exporter's TLS tests make certificates
[ ${#need[@]} -eq 0 ] && exit 0

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
