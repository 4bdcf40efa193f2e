#!/bin/sh
# The systemd units of docs/deploy/ are checked with `systemd-analyze verify`
# (tests/unit/test_deploy_files.py), which Debian's systemd package installs; systemd need
# not run (a container without it is fine).
exec sh "$(dirname "$0")/ensure_package.sh" /usr/bin/systemd-analyze systemd \
  "the systemd units' check"
