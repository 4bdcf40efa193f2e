#!/bin/sh
# `make lint`: the Prometheus alerting rules in docs/ops/ must load (`promtool check rules`,
# from Debian's prometheus package). Installs the package when promtool is missing and we are
# root with apt-get (CI on a fresh machine); otherwise fails saying how. The package's own
# server is not needed (and is stopped where systemd runs it).
set -eu
if ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing prometheus (for promtool check rules)"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null
    if command -v systemctl >/dev/null 2>&1; then
      systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
  else
    echo "promtool is missing: install it with: sudo apt-get install prometheus" >&2
    exit 1
  fi
fi
promtool check rules docs/ops/prometheus-rules.yml
python3 -m json.tool docs/ops/grafana-dashboard.json >/dev/null
