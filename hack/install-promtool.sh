#!/usr/bin/env bash
# Installs promtool, which tests/api/test_alerts.py runs on the chart's alert rules
# (`promtool check rules`, `promtool test rules`), from Debian's `prometheus` package: into
# $PROMTOOL_DIR (default: the project's cache, beside the control plane's binaries), once.
#
# The package is fetched with `apt-get download` and only its promtool is unpacked, rather than
# `apt-get install prometheus`: the package's postinst starts a Prometheus server through its
# init script wherever systemd is not running (a container, CI), and the project needs none.
# promtool is one static binary. Idempotent: a promtool already there (or on PATH) is kept.
set -euo pipefail

dir="${PROMTOOL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/resourceconsist/promtool}"
if [[ -x $dir/promtool ]]; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "error: no apt-get to fetch Debian's prometheus package; put a promtool at $dir/promtool" >&2
  exit 1
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# apt's download sandbox user must be able to write where the package lands.
chmod 0777 "$work"
cd "$work"
if ! apt-get download -qq prometheus >/dev/null 2>&1; then
  # A fresh machine has no package lists yet.
  apt-get update -qq
  apt-get download -qq prometheus >/dev/null
fi
dpkg-deb -x prometheus_*.deb unpacked
mkdir -p "$dir"
install -m 0755 unpacked/usr/bin/promtool "$dir/promtool"
"$dir/promtool" --version >&2
