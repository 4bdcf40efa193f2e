#!/bin/sh
# The admin's browser test (tests/integration/admin/test_browser.py) drives Debian's headless Chromium
# through /usr/bin/chromedriver. `make test` runs this first: it installs both when they are
# missing and we are root with apt-get (CI on a fresh machine); otherwise it only says how.
set -eu
if command -v chromium >/dev/null 2>&1 && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing chromium and chromium-driver (for the admin's browser test)"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null
else
  echo "chromium or /usr/bin/chromedriver is missing, so the browser test will fail;" \
       "install them with: sudo apt-get install chromium chromium-driver" >&2
fi
