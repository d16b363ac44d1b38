#!/usr/bin/env bash
# The whole suite: lint, the quick tests, every benchmark's --quick mode (that each still runs
# and flags nothing; never a speed), the slow tests, then Parsl's own generic test suite
# against a stock HTEX on LocalBackfillProvider pilots and on SlurmBackfillProvider pilots, on
# the loopback cluster and on separate hosts (HOSTS=netns).
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
"$py" scripts/bench-quick.py --python "$py" || exit $?
# On two workers (pytest-xdist; a file's tests stay on one worker, each worker its own loopback
# clusters): most of these tests wait on schedulers, heartbeats and rank start-ups, not CPU.
"$py" -m pytest -q -m slow -n 2 --dist loadfile
rc=$?
if [ $rc -eq 5 ]; then echo "no slow tests selected"; rc=0; fi
[ $rc -eq 0 ] || exit $rc

# Parsl's own suite against a stock HTEX on our providers and against our BackfillExecutor
# (exclusions: scripts/parsl-suite.sh).
scripts/parsl-suite.sh "$py" local || exit $?
scripts/parsl-suite.sh "$py" backfill || exit $?
scripts/parsl-suite.sh "$py" slurm || exit $?
scripts/parsl-suite.sh "$py" backfill-slurm || exit $?
# The same two on separate hosts (network namespaces: its pilots' ranks and workers reach this
# machine over TCP, as on a real cluster).
HOSTS=netns scripts/parsl-suite.sh "$py" slurm || exit $?
HOSTS=netns scripts/parsl-suite.sh "$py" backfill-slurm
