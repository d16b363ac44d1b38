"""The original BFTrainer replayer beside ours in ``--original-accounting``, on one instance.

The original (github.com/BFTrainer/Replayer: ``BFTrainer-replay.py``, ``jobs.py``, ``trace.py``,
``progMIP.py``, ``progGRB.py``, ``util.py``) has no licence, so none of it is in this
repository: ``--original-src DIR`` points at a checkout of it (``git clone
https://github.com/BFTrainer/Replayer``). It runs unchanged, from a copy, in a virtual
environment of its own that this benchmark makes once (``--venv``; python-mip 1.15.0 with CBC:
2.0.0 crashes inside CBC on the original's SOS2 models; pandas 1.5 and NumPy 1.26, the last
versions with the calls it uses). ``benchmarks/_original_driver.py`` runs it there (what it binds
before the script starts is in its docstring). Without ``--original-src`` the benchmark says what
it needs and exits 2.

For each instance (a job set on the first N nodes of the dev week, run to completion or over a
window) and each policy (the MILP at T_fwd 10 s with a 10 s limit, and the original's
equal-share heuristic), the original and ``parsl_bf.replay`` with
:data:`~parsl_bf.replay.simulator.ORIGINAL_ACCOUNTING` replay the same trace rows and jobs. Both
sides' figures are computed the same way: util = allocated ÷ idle node-seconds, E_used and
E_avail = Σ samples / P_j(1) over allocated and idle node-seconds, from the start to the
original's last replayed event (its end when every job is done, else the window's last event;
ours is given that end). The original's come from its own output: ``step-logs.csv`` (idle and
allocated nodes after each event), ``[progress]`` / ``[Done]`` lines (each job's samples).

Fidelity bounds (docs/replay.md, "The original's accounting"): equal-share, which has no solver,
within ±0.01 of the original's E_avail and util; the MILP within ±0.03, or beyond it only where
the solver explains it. For the MILP the benchmark also re-solves every problem the original's
CBC solved (recorded by the driver) with our solver and scores both answers with our objective,
which is the original's, and replays the original's own CBC answers in our accounting
(``cbc_decisions``; it follows the original only until a preemption hits other jobs in the
two, so it judges the accounting only where it followed at least 90 % of the solves, and must
then be within ±0.01). A MILP miss beyond ±0.03 is the solver's where CBC's answers were worse
than ours, or missing at its time limit, on some problems and better on none; any other is an
anomaly. A problem on which the original's
answer scores better than ours, or on which our score of its answer differs from the objective
CBC printed, is listed under ``suspect`` (the models would disagree).

``--quick``: hps-shufflenet-10J on 64 nodes, first 12 h, both policies. Ends with one JSON
line: ``original``, ``ours_original_accounting`` and ``diff`` per ``instance/policy``,
``within_bounds``, ``solver`` and ``anomalies`` (a bound missed).
"""

from __future__ import annotations

import argparse
import bisect
import csv
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from parsl_bf.allocation import Allocation, AllocationProblem, Objective, SolveStatus
from parsl_bf.allocation.gains import score
from parsl_bf.inputs.trace import IdleTrace, load_trace
from parsl_bf.replay import default_data_dir, load_job_set, missing_data
from parsl_bf.replay.jobsets import Job
from parsl_bf.replay.policies import make_policy
from parsl_bf.replay.simulator import ORIGINAL_ACCOUNTING, ReplayConfig, replay

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "_original_driver.py"
#: The original's files (``_original_driver.py`` keeps a copy of this list: it runs without
#: parsl_bf and cannot import it).
SOURCES = ("BFTrainer-replay.py", "jobs.py", "trace.py", "util.py", "progMIP.py", "progGRB.py")
#: The original's own dependencies, pinned (see the module docstring).
REQUIREMENTS = ("mip==1.15.0", "pandas==1.5.3", "numpy==1.26.4", "scipy==1.11.4", "h5py==3.11.0")
DEFAULT_VENV = Path.home() / ".cache" / "parsl_bf" / "bftrainer-original-venv"
HOUR = 3600
#: Where ``--save`` keeps the full run's figures for benchmarks/evaluation.py and the docs.
SAVED = HERE / "original-figures.json"
#: Share of the original's solves that ours, given CBC's answers, must follow for its figures
#: to judge the accounting.
CONCLUSIVE = 0.9
#: |ours − original| allowed, on E_avail and util, by policy.
BOUNDS = {"equal-share": 0.01, "milp": 0.03}
POLICIES = ("equal-share", "milp")
FIGURES = ("util", "E_used", "E_avail", "makespan_h")


@dataclass(frozen=True)
class Instance:
    """A job set on the first ``nodes`` nodes of the dev week, to completion or ``hours``."""

    jobs: str
    nodes: int
    hours: float | None = None

    @property
    def name(self) -> str:
        span = "to-completion" if self.hours is None else f"{self.hours:g}h"
        return f"{self.jobs}@{self.nodes}/{span}"


INSTANCES = (
    Instance("hps-shufflenet-10J", 64),
    Instance("ImageNet-imgps-dev-501J", 256, 48),
    Instance("ImageNet-spdup-dev-501J", 256, 48),
)
QUICK = (Instance("hps-shufflenet-10J", 64, 12),)


class Failed(Exception):
    """A step that cannot go on; its message is the one line printed."""


# ---------------------------------------------------------------------------------------------
# The original's environment and runs


def check_source(src: Path) -> str:
    """The original's revision (its git commit, else a hash of its sources); raises if absent."""
    missing = [n for n in SOURCES if not (src / n).is_file()]
    if missing:
        raise Failed(f"{src}: not a checkout of BFTrainer/Replayer (no {', '.join(missing)})")
    try:
        out = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        digest = hashlib.sha256(b"".join((src / n).read_bytes() for n in SOURCES))
        return f"sha256:{digest.hexdigest()[:16]} (not a git checkout)"


def ensure_venv(venv: Path) -> Path:
    """The original's virtual environment, made on first use; its python."""
    python = venv / "bin" / "python"
    stamp = venv / "parsl_bf-requirements.txt"
    wanted = "\n".join(REQUIREMENTS) + "\n"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    print(f"making the original's environment in {venv} ({' '.join(REQUIREMENTS)}) ...", flush=True)
    for cmd in (
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(python), "-m", "pip", "install", "--quiet", *REQUIREMENTS],
    ):
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise Failed(f"{' '.join(cmd[:4])} failed: {' / '.join(tail)}")
    stamp.write_text(wanted)
    return python


def write_instance(trace: IdleTrace, jobs: list[Job], t0: str, end_s: int | None, work: Path):
    """The instance as the driver reads it: every trace row up to ``end_s``, and the jobs."""
    times, rows = [], []
    for t, idle in trace.steps():
        if end_s is not None and t > end_s:
            break
        times.append(int(t))
        rows.append(idle.astype(np.int8))
    work.mkdir(parents=True, exist_ok=True)
    np.save(work / "states.npy", np.vstack(rows), allow_pickle=False)
    keys = ("id", "submit_s", "min_nodes", "max_nodes", "rescale_up_s", "rescale_down_s", "work")
    spec = {
        "t0": t0,
        "times_s": times,
        "nodes": list(trace.nodes),
        "jobs": [
            {k: getattr(j, k) for k in keys}
            | {"nodes": list(j.nodes), "throughput": list(j.throughput), "value": list(j.value)}
            for j in jobs
        ],
    }
    (work / "instance.json").write_text(json.dumps(spec))
    return times


def run_original(python: Path, src: Path, work: Path, policy: str, nodes: int, args) -> str:
    """The original's stdout for one policy; raises with its error if it fails."""
    cmd = [
        str(python),
        str(DRIVER),
        str(src.resolve()),
        str(work),
        "1" if policy == "milp" else "0",
        str(nodes),
        str(int(args.tfwd)),
        str(int(args.time_limit)),
        str(args.max_jobs),
        str(args.seed),
    ]
    # A run is a function of its command line and instance: one already in ``work`` for the
    # same ones is read again rather than repeated (the MILP runs take minutes).
    digest = run_digest(cmd, src, work)
    stamp, out = work / "run.sha256", work / "stdout.txt"
    if stamp.exists() and out.exists() and stamp.read_text() == digest:
        print(f"  reusing the original's run in {work}", flush=True)
        return out.read_text()
    stamp.unlink(missing_ok=True)
    env = os.environ | {"PYTHONWARNINGS": "ignore::FutureWarning"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    out.write_text(done.stdout)
    if done.returncode:
        tail = " / ".join(done.stderr.strip().splitlines()[-3:])
        raise Failed(f"the original replayer exited {done.returncode} ({policy}): {tail}")
    stamp.write_text(digest)
    return done.stdout


def run_digest(cmd: list[str], src: Path, work: Path) -> str:
    """What a run of the original depends on: the driver, its arguments, the instance and the
    original's sources."""
    digest = hashlib.sha256(json.dumps(cmd[2:]).encode())
    for path in [DRIVER, work / "instance.json", work / "states.npy", *(src / n for n in SOURCES)]:
        digest.update(path.read_bytes())
    return digest.hexdigest()


PROGRESS = re.compile(r"(\S+) : \S+% = (\S+) / \S+")


def original_figures(
    stdout: str, work: Path, t0: str, times: list[int], initial_idle: int, jobs
) -> dict:
    """The original's figures, from its step log and its per-job progress lines."""
    p1 = {j.id: j.p1 for j in jobs}
    work_of = {j.id: j.work for j in jobs}
    samples: dict[str, float] = {}
    allocated0, solves = None, []
    done = 0
    for line in stdout.splitlines():
        if line.startswith("[initial-map]"):
            allocated0 = int(line.split("=")[1])
        elif line.startswith("[Done]"):
            for jid in line.split(" ", 3)[3].split(", "):
                samples[jid] = work_of[jid]
                done += 1
        elif line.startswith("[progress];"):
            for part in line.split("; ")[1:]:
                m = PROGRESS.match(part)
                if m is None:
                    raise Failed(f"{work / 'stdout.txt'}: unreadable progress entry {part!r}")
                samples[m[1]] = float(m[2])
        elif line.startswith("[solve] "):
            solves.append(json.loads(line[8:]))
    if allocated0 is None:
        raise Failed(f"{work / 'stdout.txt'}: no [initial-map] line (driver not used?)")
    with open(work / "run-itrOut" / "step-logs.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    # The nodes after row r's event hold until the next row's.
    start = datetime.fromisoformat(t0)
    t = [times[0]] + [
        round((datetime.fromisoformat(r["evtTime"]) - start).total_seconds()) for r in rows
    ]
    idle = [initial_idle] + [int(r["nNd"]) for r in rows]
    alloc = [allocated0] + [int(r["nNrun"]) for r in rows]
    idle_s = sum(idle[i - 1] * (t[i] - t[i - 1]) for i in range(1, len(t)))
    alloc_s = sum(alloc[i - 1] * (t[i] - t[i - 1]) for i in range(1, len(t)))
    norm = sum(s / p1[j] for j, s in samples.items())
    logged = sum(float(r["Thr"]) for r in rows)
    finished = any(line == "there is no more job to run" for line in stdout.splitlines())
    return {
        "util": alloc_s / idle_s,
        "E_used": norm / alloc_s if alloc_s else None,
        "E_avail": norm / idle_s,
        "makespan_h": (t[-1] - t[0]) / HOUR if finished else None,
        "end_s": t[-1],
        "samples": sum(samples.values()),
        "samples_in_step_log": logged,
        "jobs_done": done,
        "jobs_admitted": len(samples),
        "idle_node_s": idle_s,
        "solves": solves,
    }


# ---------------------------------------------------------------------------------------------
# Ours, and the solver check


def ours(trace: IdleTrace, jobs: list[Job], policy, end_s: int | None, args, progress=None) -> dict:
    """Our replay in the original's accounting; ``policy`` a name or a policy."""
    milp = policy == "milp"
    if isinstance(policy, str):
        policy = make_policy(policy, args.time_limit)
    config = ReplayConfig(
        tfwd=args.tfwd,
        objective=Objective.THROUGHPUT,
        max_jobs=args.max_jobs,
        end_s=end_s,
        bound_buckets=0,
        **ORIGINAL_ACCOUNTING,
    )
    s = replay(trace, jobs, policy, config, progress=progress).summary
    return {
        "util": s["util"],
        "E_used": s["E_used"],
        "E_avail": s["E_avail"],
        "makespan_h": s["makespan_s"] / HOUR if s["makespan_s"] is not None else None,
        "end_s": end_s if s["makespan_s"] is None else s["makespan_s"],
        "samples": s["samples"],
        "jobs_done": s["jobs_done"],
        "jobs_admitted": s["jobs_admitted"],
        "idle_node_s": s["idle_node_s"],
        # As docs/evaluation.md counts them: GLPK's incumbent or the exact fallback at the limit.
        "at_time_limit": sum(s["solve_status"].get(k, 0) for k in ("feasible", "fallback"))
        if milp
        else None,
    }


def cbc_decisions(solves: list[dict], times: list[int], time_limit: float):
    """A policy that answers as the original's CBC did, its progress callback, and a tally.

    At each trace event (``times``; the callback follows the replay through them) a problem
    gets the answer of the original's ``[solve]`` at the same event, if that was a problem of
    the same jobs at the same current counts (on a solve CBC did not report optimal, the
    current counts: the original keeps its map). Any other problem (the two replays have
    parted: a preemption hit other jobs, or the original's first map was its random one) gets
    our MILP's answer and counts as ``parted``; one with no node to give is answered at once."""
    milp = make_policy("milp", time_limit)
    by_t = {r["t"]: r for r in solves}
    tally = {"followed": 0, "parted": 0}
    now = [0]  # index into times of the event being replayed

    def progress(t: int, events: int) -> None:
        now[0] = bisect.bisect_right(times, t)

    def policy(problem: AllocationProblem) -> Allocation:
        rec = by_t.get(times[min(now[0], len(times) - 1)])
        current = [t.current_nodes for t in problem.tasks]
        same = (
            rec is not None
            and rec["ids"] == [t.id for t in problem.tasks]
            and [t["current"] for t in rec["tasks"]] == current
        )
        if not same:
            if problem.capacity > 0:
                tally["parted"] += 1
            return milp(problem)
        tally["followed"] += 1
        given = rec["counts"] if rec["status"] == "OPTIMAL" else current
        counts = {t.id: n for t, n in zip(problem.tasks, given, strict=True)}
        value = score(problem, counts)[0]
        return Allocation(status=SolveStatus.OPTIMAL, objective=value, counts=counts, solve_s=0.0)

    return policy, progress, tally


def solver_check(solves: list[dict], args) -> tuple[dict, list[str]]:
    """Every MILP the original solved, solved again by ours; both answers scored by ours."""
    from parsl_bf.allocation import TaskSpec

    milp = make_policy("milp", args.time_limit)
    better = same = worse = 0
    shortfall, suspect = [], []
    for k, rec in enumerate(solves):
        if rec["status"] != "OPTIMAL":
            continue  # the original keeps its map: nothing to score
        tasks = [
            TaskSpec(
                id=f"j{i}",
                min_nodes=t["min_nodes"],
                max_nodes=t["max_nodes"],
                current_nodes=t["current"],
                nodes=tuple(t["nodes"]),
                throughput=tuple(t["value"]),
                rescale_up_s=t["rescale_up_s"],
                rescale_down_s=t["rescale_down_s"],
            )
            for i, t in enumerate(rec["tasks"])
        ]
        problem = AllocationProblem(
            tasks=tasks,
            free_nodes=rec["nodes"] - sum(t["current"] for t in rec["tasks"]),
            tfwd=args.tfwd,
            objective=Objective.THROUGHPUT,
            cap_at_remaining_work=False,
        )
        theirs = score(problem, {f"j{i}": n for i, n in enumerate(rec["counts"])})[0]
        mine = milp(problem).objective
        scale = max(1.0, abs(mine))
        if rec.get("objective") is not None and abs(theirs - rec["objective"]) > 1e-6 * scale:
            suspect.append(
                f"solve {k}: our score of CBC's answer {theirs} ≠ its {rec['objective']}"
            )
        if mine > theirs + 1e-6 * scale:
            better += 1
            shortfall.append((mine - theirs) / scale)
        elif theirs > mine + 1e-6 * scale:
            worse += 1
            suspect.append(f"solve {k}: CBC's answer scores {theirs} > ours {mine}")
        else:
            same += 1
    out = {
        "solves": len(solves),
        "original_status": dict(Counter(rec["status"] for rec in solves)),
        "ours_better": better,
        "same": same,
        "original_better": worse,
        "mean_shortfall_of_original": float(np.mean(shortfall)) if shortfall else 0.0,
    }
    return out, suspect


# ---------------------------------------------------------------------------------------------


def fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--original-src", type=Path, help="a checkout of github.com/BFTrainer/Replayer")
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="the original's environment")
    ap.add_argument("--work", type=Path, help="keep the runs' files here (default: a temp dir)")
    ap.add_argument("--policies", default=",".join(POLICIES), help="equal-share and/or milp")
    ap.add_argument("--tfwd", type=float, default=10.0)
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds per MILP solve")
    ap.add_argument("--max-jobs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0, help="the original's random initial map")
    ap.add_argument("--quick", action="store_true", help="one instance, first 12 h")
    ap.add_argument(
        "--save", type=Path, help=f"also write the JSON here (the docs read {SAVED.name})"
    )
    args = ap.parse_args()
    if args.original_src is None:
        print(
            "original.py needs the original replayer: git clone "
            "https://github.com/BFTrainer/Replayer, then --original-src that directory "
            "(its dependencies are installed in --venv, from PyPI)",
            file=sys.stderr,
        )
        return 2
    policies = [p for p in args.policies.split(",") if p]
    bad = [p for p in policies if p not in POLICIES]
    if bad or not policies:
        print(
            f"--policies: {','.join(bad) or 'none'}: choose from {','.join(POLICIES)}",
            file=sys.stderr,
        )
        return 2
    try:
        commit = check_source(args.original_src)
    except Failed as e:
        print(f"original.py: {e}", file=sys.stderr)
        return 2
    if (why := missing_data()) is not None:
        print(why, file=sys.stderr)
        return 2
    try:
        return run(args, policies, commit)
    except Failed as e:
        print(f"original.py: {e}", file=sys.stderr)
        return 1


def run(args, policies: list[str], commit: str) -> int:
    python = ensure_venv(args.venv)
    data = default_data_dir()
    t0 = json.loads((data / "trace" / "meta.json").read_text())["t0"]
    root = args.work or Path(tempfile.mkdtemp(prefix="parsl_bf-original-"))
    results: dict[str, dict] = {}
    for inst in QUICK if args.quick else INSTANCES:
        trace = load_trace(data / "trace", inst.nodes)
        jobs = load_job_set(data / "jobs" / f"{inst.jobs}.json")
        end = None if inst.hours is None else int(inst.hours * HOUR)
        for policy in policies:
            key = f"{inst.name}/{policy}"
            work = root / key.replace("/", "_").replace("@", "_")
            times = write_instance(trace, jobs, t0, end, work)
            began = time.perf_counter()
            stdout = run_original(python, args.original_src, work, policy, inst.nodes, args)
            theirs = original_figures(stdout, work, t0, times, int(trace.initial.sum()), jobs)
            theirs["wall_s"] = time.perf_counter() - began
            began = time.perf_counter()
            # To completion: each side to its own last completion; over a window: both to the
            # window's last event, where the original stops.
            cut = None if end is None else theirs["end_s"]
            mine = ours(trace, jobs, policy, cut, args)
            mine["wall_s"] = time.perf_counter() - began
            print(
                f"{key}: original E_avail {fmt(theirs['E_avail'])} util {fmt(theirs['util'])} "
                f"({theirs['wall_s']:.0f} s), ours {fmt(mine['E_avail'])} util "
                f"{fmt(mine['util'])} ({mine['wall_s']:.0f} s)",
                flush=True,
            )
            results[key] = {"policy": policy, "original": theirs, "ours": mine}
            if policy == "milp":  # the accounting alone: ours fed the original's CBC answers
                follow, progress, tally = cbc_decisions(theirs["solves"], times, args.time_limit)
                results[key]["cbc"] = ours(trace, jobs, follow, cut, args, progress) | tally
    return report(results, commit, args)


def report(results: dict, commit: str, args) -> int:
    anomalies: list[str] = []
    suspect: list[str] = []
    out_orig, out_ours, diff, within, solver = {}, {}, {}, {}, {}
    print()
    print(f"{'instance / policy':58} {'side':9} " + " ".join(f"{k:>10}" for k in FIGURES))
    for key, r in results.items():
        theirs, mine = r["original"], r["ours"]
        sides = [("original", theirs), ("ours", mine)] + (
            [("ours, CBC", r["cbc"])] if "cbc" in r else []
        )
        for side, f in sides:
            print(f"{key:58} {side:9} " + " ".join(f"{fmt(f[k]):>10}" for k in FIGURES))
        d = {
            k: mine[k] - theirs[k]
            for k in ("util", "E_used", "E_avail")
            if mine[k] is not None and theirs[k] is not None
        }
        bound = BOUNDS[r["policy"]]
        ok = abs(d.get("E_avail", 1.0)) <= bound and abs(d.get("util", 1.0)) <= bound
        got = f"E_avail {d.get('E_avail')}, util {d.get('util')} beyond ±{bound}"
        if abs(theirs["samples"] - theirs["samples_in_step_log"]) > 1e-6 * max(
            1.0, theirs["samples"]
        ):
            suspect.append(f"{key}: the original's progress lines and step log disagree")
        for f in (theirs, mine):
            if f["util"] > 1 + 1e-9:
                anomalies.append(f"{key}: util {f['util']} above 1")
        keep = ("util", "E_used", "E_avail", "makespan_h", "jobs_done", "jobs_admitted")
        out_orig[key] = {k: theirs[k] for k in keep}
        out_ours[key] = {k: mine[k] for k in keep} | {"at_time_limit": mine["at_time_limit"]}
        diff[key] = d
        within[key] = ok
        if r["policy"] != "milp" and not ok:
            anomalies.append(f"{key}: {got}")
        if r["policy"] == "milp":
            solver[key], why = solver_check(theirs["solves"], args)
            suspect.extend(f"{key}: {w}" for w in why)
            cbc = r["cbc"]
            d_cbc = {k: cbc[k] - theirs[k] for k in ("util", "E_avail")}
            fair = BOUNDS["equal-share"]  # no solver left between the two: the tight bound
            ok_cbc = all(abs(v) <= fair for v in d_cbc.values())
            # Given CBC's answers, ours follows the original until a preemption hits other jobs
            # in the two (node identities): only a replay that followed nearly every solve
            # says something about the accounting.
            conclusive = cbc["followed"] >= CONCLUSIVE * max(1, len(theirs["solves"]))
            if conclusive and not ok_cbc:
                anomalies.append(f"{key}: with CBC's answers {d_cbc} beyond ±{fair}")
            # Beyond the MILP's bound is the solver's doing if CBC's answers were worse than
            # ours or missing (time limit) on some problems, never better, and the replay of
            # its answers does not say otherwise.
            s = solver[key]
            cbc_short = s["ours_better"] + s["solves"] - s["original_status"].get("OPTIMAL", 0)
            explained = cbc_short > 0 and s["original_better"] == 0 and (ok_cbc or not conclusive)
            if not ok and not explained:
                anomalies.append(f"{key}: {got}")
            solver[key]["beyond_bound_explained_by_solver"] = not ok and explained
            solver[key] |= {
                "ours_with_cbc_answers": {k: cbc[k] for k in ("util", "E_used", "E_avail")},
                "diff_with_cbc_answers": d_cbc,
                "within_bounds_with_cbc_answers": ok_cbc,
                "cbc_answers_followed": cbc["followed"],
                "cbc_replay_conclusive": conclusive,
                "parted": cbc["parted"],
            }
    print()
    print(f"bounds: equal-share ±{BOUNDS['equal-share']}, milp ±{BOUNDS['milp']} (E_avail, util)")
    for key, s in solver.items():
        print(
            f"{key}: of {s['solves']} MILPs the original's CBC solved ({s['original_status']}), "
            f"ours found a better answer on {s['ours_better']} (CBC's mean shortfall "
            f"{100 * s['mean_shortfall_of_original']:.1f}%), the same on {s['same']}, a worse "
            f"one on {s['original_better']}; ours given CBC's answers: E_avail "
            f"{fmt(s['ours_with_cbc_answers']['E_avail'])}, util "
            f"{fmt(s['ours_with_cbc_answers']['util'])} ({s['cbc_answers_followed']} followed, "
            f"{s['parted']} parted)"
        )
    summary = {
        "original": out_orig,
        "ours_original_accounting": out_ours,
        "diff": diff,
        "within_bounds": within,
        "bounds": BOUNDS,
        "solver": solver,
        "original_commit": commit,
        "tfwd": args.tfwd,
        "time_limit_s": args.time_limit,
        "max_jobs": args.max_jobs,
        "quick": args.quick,
        "anomalies": anomalies,
        "suspect": suspect[:20],
    }
    if args.save is not None:
        args.save.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    return 1 if anomalies else 0


if __name__ == "__main__":
    sys.exit(main())
