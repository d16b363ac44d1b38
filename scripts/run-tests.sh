#!/usr/bin/env bash
# The whole suite: lint, the quick tests, the slow ones, then Parsl's own generic test suite
# against a stock HTEX on LocalBackfillProvider pilots.
# pytest exits 5 when a selection collects no tests; that is an error for the quick set
# (something is broken) but fine for the slow set while it is empty.
set -uo pipefail
# Absolute, but not resolved: the venv's python is a symlink to the base interpreter.
py=${1:-.venv/bin/python}
bin=$(cd "$(dirname "$py")" && pwd)
py=$bin/$(basename "$py")
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci}
"$bin/ruff" check parsl_bf tests benchmarks || exit 1
"$py" -m pytest -q || exit $?
"$py" -m pytest -q -m slow
rc=$?
if [ $rc -eq 5 ]; then echo "no slow tests selected"; rc=0; fi
[ $rc -eq 0 ] || exit $rc

# Parsl's suite: excluded are cleannet (needs a clean network), issue_3620 and the two
# unix_filesystem_permissions_required tests (they fail as root by design), and
# test_stdout_stderr_staging_zip, which failed 2 of 9 full-suite runs here (the zip file not
# there yet when the stdout future resolved) and never alone with either this provider or
# Parsl's LocalProvider; see docs/providers.md. HTEX needs the venv's bin/ on PATH; workers
# import this checkout.
suite=$("$py" -c 'import os, parsl.tests; print(os.path.dirname(parsl.tests.__file__))')
work=$(mktemp -d)
(cd "$work" && PATH="$bin:$PATH" PYTHONPATH="$root" "$py" -m pytest "$suite" -q \
    -p no:cacheprovider --config "$root/tests/parsl_suite/htex_local_backfill.py" \
    -k "not cleannet and not issue_3620 and not unix_filesystem_permissions_required \
        and not test_stdout_stderr_staging_zip")
rc=$?
rm -rf "$work"
exit $rc
