"""Run the original BFTrainer replayer on one instance; started by ``benchmarks/original.py``.

This file runs in the original's own virtual environment (python-mip, pandas 1.5, numpy 1.26),
never in ours, and imports nothing of ``parsl_bf``. It reads the instance that
``benchmarks/original.py`` wrote (``instance.json`` and ``states.npy``: plain data, loaded
without pickle), writes the pandas pickles the original's command line asks for, and runs the
original's ``BFTrainer-replay.py`` unchanged, from a copy in the work directory, with three
bindings made before it starts:

* ``gurobipy``: the script imports it for one constant, ``GRB.OPTIMAL``; here that constant is
  python-mip's ``OptimizationStatus.OPTIMAL``, as the original's README says to do when the
  CBC solver (``progMIP.py``) is used instead of Gurobi.
* ``progGRB.re_allocate`` is ``progMIP.re_allocate`` (the CBC MILP); ``re_allocate_ndf``, the
  equal-share heuristic, stays the one in ``progGRB.py``, which has no CBC twin.
* ``jobs.gen_rand_job_map`` (the random initial map of the jobs present at the start) is
  called under a fixed NumPy seed and prints the nodes it gave, which the step log does not
  record.

Each MILP solve also prints one ``[solve] {json}`` line: the problem (the jobs' current node
counts, bounds, curves and rescale costs; the idle nodes), CBC's status, the node counts of its
answer and the objective it printed, with the event's time and the jobs' ids (read from the
script's loop variables), so that the benchmark can solve the same problem again and replay
CBC's answers in ours.

The replayer's own output (stdout and ``<name>-itrOut/step-logs.csv``) is what
``benchmarks/original.py`` reads.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import runpy
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pandas as pd

#: Rows the original's script drops before it replays (``.iloc[1000:]``, the source trace's
#: warm-up): the instance is prepended with that many copies of its first state.
WARM_UP_ROWS = 1000
SOURCES = ("BFTrainer-replay.py", "jobs.py", "trace.py", "util.py", "progMIP.py", "progGRB.py")


def write_inputs(instance: dict, states: np.ndarray, work: Path) -> dict[str, Path]:
    """The original's three input pickles (node states, job bounds, job curves), in ``work``."""
    t0 = pd.Timestamp(instance["t0"])
    times = [t0 + pd.Timedelta(seconds=int(t)) for t in instance["times_s"]]
    warm = [t0 - pd.Timedelta(seconds=WARM_UP_ROWS - i) for i in range(WARM_UP_ROWS)]
    rows = np.vstack([np.repeat(states[:1], WARM_UP_ROWS, axis=0), states]).astype(np.int8)
    nstat = pd.DataFrame(rows, index=pd.DatetimeIndex(warm + times), columns=instance["nodes"])
    jobs = instance["jobs"]
    index = [j["id"] for j in jobs]
    tsub = [t0 + pd.Timedelta(seconds=float(j["submit_s"])) for j in jobs]
    bounds = pd.DataFrame(
        {
            "Tcup": [float(j["rescale_up_s"]) for j in jobs],
            "Tcdw": [float(j["rescale_down_s"]) for j in jobs],
            "Jmin": [int(j["min_nodes"]) for j in jobs],
            "Jmax": [int(j["max_nodes"]) for j in jobs],
            "Pmax": [float(j["work"]) for j in jobs],
            "Tsub": tsub,
        },
        index=index,
    )
    curves = pd.DataFrame(
        {
            "Ns": [list(j["nodes"]) for j in jobs],
            "Ps": [list(j["throughput"]) for j in jobs],
            "Os": [list(j["value"]) for j in jobs],
            "Tsub": tsub,
        },
        index=index,
    )
    paths = {"ndmap": work / "ndstat.pkl", "bdfn": work / "jbnd.pkl", "scfn": work / "jnps.pkl"}
    nstat.to_pickle(paths["ndmap"])
    bounds.to_pickle(paths["bdfn"])
    curves.to_pickle(paths["scfn"])
    return paths


def bind_solver(seed: int, t0: pd.Timestamp) -> None:
    """The three bindings of the module docstring."""
    from mip import OptimizationStatus

    grb = types.ModuleType("gurobipy")
    grb.GRB = types.SimpleNamespace(OPTIMAL=OptimizationStatus.OPTIMAL)
    sys.modules["gurobipy"] = grb
    import jobs
    import progGRB
    import progMIP

    progGRB.re_allocate = recorded(progMIP.re_allocate, t0)
    random_map = jobs.gen_rand_job_map

    def seeded_map(nJ, nN, jmin, jmax):
        np.random.seed(seed)
        out = random_map(nJ, nN, jmin, jmax)
        print(f"[initial-map] nodes={int(out.sum())}", flush=True)
        return out

    jobs.gen_rand_job_map = seeded_map


def recorded(solve, t0: pd.Timestamp):
    """``solve`` (progMIP.re_allocate), printing each problem and answer as a ``[solve]`` line,
    with the event's time and the jobs' ids, read from the replayer's loop variables."""

    def wrapper(cmap, jmin, jmax, Ns, Os, Tfwd, res_up, res_dw, time_limit, **kw):
        loop = sys._getframe(1).f_globals  # the script's module namespace: its loop state
        at = loop["nstat"].index[loop["_idx"]]
        ids = [str(x) for x in loop["QJbnd"].index]
        said = io.StringIO()
        with contextlib.redirect_stdout(said):
            status, sol_map, rate, cost = solve(
                cmap, jmin, jmax, Ns, Os, Tfwd, res_up, res_dw, time_limit, **kw
            )
        print(said.getvalue(), end="")
        found = re.search(r"cost (\S+) found", said.getvalue())
        current = np.asarray(cmap).sum(axis=1)
        record = {
            "t": round((at - t0).total_seconds()),
            "ids": ids,
            "nodes": int(np.asarray(cmap).shape[1]),
            "tasks": [
                {
                    "current": int(current[j]),
                    "min_nodes": int(jmin[j]),
                    "max_nodes": int(jmax[j]),
                    "nodes": [float(x) for x in Ns[j]],
                    "value": [float(x) for x in Os[j]],
                    "rescale_up_s": float(res_up[j]),
                    "rescale_down_s": float(res_dw[j]),
                }
                for j in range(len(jmin))
            ],
            "status": status.name,
            "counts": [int(x) for x in np.asarray(sol_map).sum(axis=1)],
            "objective": float(found[1]) if found else None,
        }
        print("[solve] " + json.dumps(record), flush=True)
        return status, sol_map, rate, cost

    return wrapper


def main() -> int:
    src, work, mip_flag, nodes, tfwd, time_limit, max_jobs, seed = sys.argv[1:9]
    src, work = Path(src), Path(work)
    work.mkdir(parents=True, exist_ok=True)
    for name in SOURCES:
        shutil.copy(src / name, work / name)
    instance = json.loads((work / "instance.json").read_text())
    states = np.load(work / "states.npy", allow_pickle=False)
    paths = write_inputs(instance, states, work)
    os.chdir(work)
    sys.path.insert(0, str(work))
    bind_solver(int(seed), pd.Timestamp(instance["t0"]))
    sys.argv = [
        "BFTrainer-replay.py",
        *("-nis", "0", "-nN", nodes, "-Tfwd", tfwd, "-optTL", time_limit, "-maxJ", max_jobs),
        *("-name", "run", "-mip", mip_flag, "-print", "1"),
        *("-ndmap", str(paths["ndmap"]), "-bdfn", str(paths["bdfn"]), "-scfn", str(paths["scfn"])),
    ]
    runpy.run_path(str(work / "BFTrainer-replay.py"), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
