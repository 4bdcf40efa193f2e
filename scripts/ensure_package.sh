#!/bin/sh
# Usage: sh scripts/ensure_package.sh FILE PACKAGE WHAT [SERVICE]
# A test needs FILE, which Debian's PACKAGE installs. `make test` runs this first (through
# scripts/ensure_<tool>.sh): when FILE is missing and we are root with apt-get (CI on a fresh
# machine), it installs PACKAGE; otherwise it only says how. SERVICE, when given, is the
# package's own system service: the tests never use it (they start their own process on a
# free port), so once installed it is stopped and disabled.
set -eu
file=$1 package=$2 what=$3 service=${4:-}
if [ -x "$file" ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing $package (for $what)"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$package" >/dev/null
  if [ -n "$service" ]; then
    if command -v systemctl >/dev/null 2>&1; then
      systemctl disable --now "$service" >/dev/null 2>&1 || true
    fi
    if command -v service >/dev/null 2>&1; then
      service "$service" stop >/dev/null 2>&1 || true
    fi
  fi
else
  echo "$file is missing, so $what will fail; install it with: sudo apt-get install $package" >&2
fi
