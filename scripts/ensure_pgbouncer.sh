#!/bin/sh
# The PgBouncer deployment test (tests/e2e/test_pgbouncer.py) runs Debian's pgbouncer (1.18 on
# Debian 12: transaction pooling without prepared statements). `make test` runs this first: it
# installs it when it is missing and we are root with apt-get (CI on a fresh machine);
# otherwise it only says how. The package's own service is not used (the test starts its own
# pgbouncer on a free port), so it is stopped and disabled.
set -eu
if [ -x /usr/sbin/pgbouncer ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing pgbouncer (for the PgBouncer deployment test)"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer >/dev/null
  if command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now pgbouncer >/dev/null 2>&1 || true
  fi
else
  echo "/usr/sbin/pgbouncer is missing, so the PgBouncer test will fail;" \
       "install it with: sudo apt-get install pgbouncer" >&2
fi
