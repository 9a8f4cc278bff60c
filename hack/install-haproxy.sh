#!/usr/bin/env bash
# HAProxy from Debian's package, for the haproxy adapter's tests (docs/testing.md, "A real
# HAProxy"): installed when missing, left alone when there. Needs root (CI runs as root); as
# another user it says what to run instead.
set -euo pipefail
if command -v haproxy >/dev/null || [[ -x /usr/sbin/haproxy ]]; then
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "error: haproxy is missing; install Debian's package as root: apt-get install haproxy" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# The package's own service is not wanted (its postinst would start it where systemd does not
# run, a container or CI): the tests start their own HAProxy on loopback.
policy=/usr/sbin/policy-rc.d
made_policy=
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  made_policy=1
fi
trap 'if [[ -n $made_policy ]]; then rm -f "$policy"; fi' EXIT
if ! apt-get install -y -qq --no-install-recommends haproxy >/dev/null 2>&1; then
  # A fresh machine has no package lists yet.
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends haproxy >/dev/null
fi
haproxy -v | head -1
