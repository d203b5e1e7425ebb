#!/bin/sh
# pip-check.sh VENV: `pip check` of the image's venv (Dockerfile stages venv and runtime;
# /usr/local/lib/appliance/pip-check in the image), accepting exactly one known line: tf-keras's
# requirement of `tensorflow` while tensorflow-cpu (the same module under another distribution
# name) is installed. Every other broken requirement fails the build: pip's lines, exit 1.
set -eu
venv="$1"
out="$("$venv/bin/pip" check 2>&1)" && exit 0
if "$venv/bin/python" -c 'import importlib.metadata as m; m.version("tensorflow-cpu")' 2>/dev/null; then
    rest="$(printf '%s\n' "$out" | grep -v -E '^tf-keras [0-9.]+ requires tensorflow, which is not installed\.$' || true)"
else
    rest="$out"
fi
[ -z "$rest" ] && exit 0
printf 'pip-check: broken requirements in %s:\n%s\n' "$venv" "$rest" >&2
exit 1
