#!/usr/bin/env bash
# The GPU checks of docs/training.md ("GPU nodes"), as one run on a machine with CUDA: the GPU
# tests (tests/integration/test_gpu.py, skipped where torch sees no GPU), the rank layout of a
# GPU node, and the trainer benchmark's GPU case. Its logs and the benchmark's JSON line go to
# $OUT (the device tool's folder) or ./gpu-check.
#
#   scripts/gpu-check.sh --download   # here: wheels of what a torch-only image lacks → .whl/
#   scripts/gpu-check.sh              # there: install .whl/ into /tmp/site, then run
#
# A lent machine's image has python3 with torch (CUDA), mpi4py and pytest, but not parsl,
# pyomo, pydantic, pyzmq or the MPICH wheel (docs of the device tool: carry them as wheels,
# with `carry: [".whl"]`). Not yet run on a GPU machine: none has been lent to this project.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
if [ "${1:-}" = "--download" ]; then
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
    pins=$(.venv/bin/pip freeze | grep -iE '^(parsl|dill|pyzmq|setproctitle|tblib|typeguard|sortedcontainers|pyomo|pydantic|pydantic[-_]core|annotated[-_]types|typing[-_]inspection|mpich|mpi4py)==')
    # shellcheck disable=SC2086
    exec "$py" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl $pins
fi
out=${OUT:-gpu-check}
mkdir -p "$out"
if [ -d .whl ]; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
fi
export PYTHONUNBUFFERED=1
# Ranks are started with the mpiexec next to the interpreter (parsl_bf.training.command).
beside=$(dirname "$("$py" -c 'import sys; print(sys.executable)')")/mpiexec
if [ ! -x "$beside" ]; then
    for m in /tmp/site/bin/mpiexec "$(command -v mpiexec)"; do
        [ -x "$m" ] && ln -sf "$m" "$beside" && break
    done
fi
nvidia-smi -L | tee "$out/gpus.txt"
"$py" -c 'import torch, mpi4py; print(torch.__version__, torch.cuda.device_count(), mpi4py.__version__)'
rc=0
"$py" -m pytest -q -p no:cacheprovider -m slow -rs tests/integration/test_gpu.py \
    "tests/integration/test_executor.py::test_a_node_with_two_gpus_runs_two_ranks" \
    tests/unit/test_gpus.py 2>&1 | tee "$out/tests.log" || rc=1
"$py" benchmarks/trainer.py 2>&1 | tee "$out/trainer.log" || rc=1
exit $rc
