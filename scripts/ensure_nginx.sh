#!/bin/sh
# The nginx deployment test (tests/e2e/test_nginx.py: slow clients, TLS, an agent through
# nginx) runs Debian's nginx with docs/deploy/nginx.conf, as its own process on free ports.
exec sh "$(dirname "$0")/ensure_package.sh" /usr/sbin/nginx nginx "the nginx deployment test" nginx
