#!/usr/bin/env bash
# The whole suite: lint, the quick tests, then the slow ones.
# pytest exits 5 when a selection collects no tests; that is an error for the quick set
# (something is broken) but fine for the slow set while it is empty.
set -uo pipefail
py=${1:-python}
bin=$(dirname "$py")
"$bin/ruff" check parsl_bf tests benchmarks || exit 1
"$py" -m pytest -q || exit $?
"$py" -m pytest -q -m slow
rc=$?
if [ $rc -eq 5 ]; then echo "no slow tests selected"; rc=0; fi
exit $rc
