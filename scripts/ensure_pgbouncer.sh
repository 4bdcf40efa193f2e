#!/bin/sh
# The PgBouncer deployment test (tests/e2e/test_pgbouncer.py) runs Debian's pgbouncer (1.18 on
# Debian 12: transaction pooling without prepared statements), with docs/deploy/pgbouncer.ini.
exec sh "$(dirname "$0")/ensure_package.sh" /usr/sbin/pgbouncer pgbouncer \
  "the PgBouncer deployment test" pgbouncer
