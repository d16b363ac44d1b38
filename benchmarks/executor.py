"""End to end: the BackfillExecutor on the local emulation of a replayed trace window, against
the replay simulator's prediction for the same window.

What it measures, in one run (``--quick``: a 15 s window of 5 s holes, 3 s calibration
phases; a smoke run of the same paths, about 80 s):

1. **Window.** ``--nodes`` emulated nodes, consecutive in ``tests/data/trace64``, the busiest
   window whose idle pieces all last ``--min-hole`` wall seconds or more and that is 40 % idle
   (:func:`parsl_bf.replay.windows.choose_window`), played in ``--duration`` wall seconds.
2. **Calibration** of the example task (``digits_cnn``, width 8, global batch 64) with real
   ``mpiexec`` ranks, run like the executor runs them: world 1, 2, …, ``--nodes``, then 1
   again, each resumed from the previous one's checkpoint after a SIGTERM → P(w) and the
   rescale cost (a successor's ``first_step_at - stopped_at``). P(w) is the rate sustained
   between step reports (:func:`parsl_bf.training.reports.step_spans`: Σ samples ÷ Σ seconds),
   periodic checkpoints and slow steps included, as the runs pay them; the median of the
   reports' rates, which leaves both out and came out 3–4 % higher, is printed beside it.
   While a world-w fragment is measured, nodes − w one-rank "filler" fragments keep the other
   cores busy, as the other emulated nodes are in the runs.
3. **Real runs**, three times on the same window: walltime-aware (``min_node_life_s`` = 2 ×
   the calibrated rescale cost), the paper's model (``min_node_life_s=0``), both with warm
   rescales, and "cold": walltime-aware with ``warm_rescale=False``; ``--tasks`` elastic tasks
   (1..nodes nodes, the calibrated curve, work far beyond the window), stopped at the window's
   end. Their figures come from the executor's ``events.jsonl`` and the tasks'
   ``progress.jsonl`` (:mod:`parsl_bf.executor.analysis`: samples, allocated and pilot
   node-seconds, lost samples, preemptions, decision latency). Lost samples may be overcounted
   by up to a batch per restart (a first step at an epoch's end is shorter than a batch).
4. **Replay** of the same nodes and window with the same tasks as ``Job``s (calibrated P(w) and
   rescale cost), the milp policy with the ``throughput`` objective (as docs/executor.md's
   figures were replayed; the runs use the executor's default, ``speedup_balanced``) and the
   executor's T_fwd, on the trace's own seconds (rates ÷ time_scale; rescale costs, the
   in-place costs and T_fwd × time_scale): the same window exactly.

Accounting as in docs/replay.md ("Accounting"): util = allocated ÷ idle node-seconds, E_used
and E_avail = Σ samples / P(1) ÷ allocated and ÷ idle node-seconds. A pilot holds its node
until its processes have exited after the SIGTERM at its hole's end, so util (and "held") can
exceed 1 slightly. "E_av*" is E_avail with the run's own P(1) (the rate its 1-rank fragments
sustained) in place of the calibration's. An efficiency above the most the calibrated curve
allows (max P(n) / (n·P(1)), 1 for sublinear scaling) cannot be true (P(1) measured under other
contention than the run): it is printed as IMPOSSIBLE, left out of the table and the JSON line,
and listed under ``impossible``; so is a real run's below 0. A replay's below 0 (the original's
accounting charges each preemption R·P whatever was trained since: a window short against the
rescale costs, as ``--quick``'s, can charge more than it trained) is left out as undefined
(``replay_undefined``) and marks the run noisy. A run is marked noisy (``"noisy": true`` and
``noisy_reasons`` in the JSON line, NOISY lines in the table) when an efficiency exceeds
1 + 0.02 or a run's own P(1) differs from the calibration's by more than 10 %: its ratios to
the replay then say more about the machine's other load than about the executor. The
executor's design: docs/design.md.

Emulation choices: a node is a core (the default ``--nodes 2`` on this 2-core machine), so every
rank runs one torch thread (``PARSL_BF_THREADS_PER_RANK=1``; the worker would give a rank all
the host's cores, oversubscribing them), and with ``--nodes`` up to the cores each node is
pinned to its own core (``pin_cores``, and ``taskset`` for the calibration's fragments): a
fresh pilot's process start-up then takes no CPU from another node's training, as on a real
machine (unpinned, the runs' own P(1) came out 6–9 % under the calibration's). Pilots of one
node each (``max_nodes=1``: the replay has per-node holes); a 2-node fragment spans two pilots.
``known_holes=True`` (a pilot's walltime is its hole), ``walltime_notice_s`` ``--notice`` (the
most: the executor's notice follows the tasks' own stop times once they have stopped).
T_fwd: the median idle piece of the window, for the executor and the replay.

The real system pays what the replay does not: a fragment started on a fresh pilot costs its
process start-up and the pilot's, where the replay's charge R·P(0) is 0. So the replay runs
twice: "replay" with the replay's own accounting, where a start is free as in the original
(``E_avail_replay``), and "replay+" charged what
the real runs paid, measured from their reports (:mod:`parsl_bf.executor.analysis`): a start
from 0 nodes costs the median fragment start (launch → first step, ``charge_starts`` with
``Job.start_s``) and a rescale the median warm hand-over (stop → successor's first step);
``replay_charged_costs_s`` in the JSON line. The machine may be shared: other
processes' CPU (``/proc/stat`` less this run's processes) is measured for the calibration and
each run ("others", in cores), and before each the benchmark waits up to ``--quiet-wait`` s
for it to drop under 0.5 cores.

Prints a table (rows aware / paper / cold / replay / replay+) and ends with one JSON line,
whose first keys are ``E_avail`` (the aware run), ``E_avail_replay``, ``decision_p50_s`` and
``decision_p95_s`` (all decisions of the runs), ``lost_samples_aware``, ``lost_samples_paper``.
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from _hosts import host_command, separate_hosts, sigterm_as_interrupt  # beside this script
from _load import Load, marked, wait_quiet

from parsl_bf.executor.analysis import (
    RESCALES,
    RunFigures,
    efficiency,
    load_run,
    percentile,
    run_figures,
)
from parsl_bf.executor.lifecycle import E_SLACK
from parsl_bf.replay.windows import Window, choose_window
from parsl_bf.training.command import mpiexec_argv, worker_argv
from parsl_bf.training.reports import ScalingProfiler, read_reports, spans_rate

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "data" / "trace64"
TASK = "parsl_bf.training.examples:digits_cnn"
BATCH = 64
OPTIONS = {"lr": 0.05, "width": 8, "global_batch": BATCH}
WORK = 10**10  # samples per task: far beyond any window
MARK = "PARSL_BF_EXECUTOR_BENCH"  # in the environment of every process this run starts
# --hosts: the loopback cluster's separate hosts, on ports apart from the tests' and other
# benchmarks'; only its namespaces are used (the emulation starts pilots there, not Slurm).
HOSTS_DIR = Path(tempfile.gettempdir()) / "bench-executor-hosts"
HOSTS_PORTS = {"ctld_port": 18937, "base_port": 28100}  # its net: 10.213.187


@dataclass(frozen=True)
class Hosts:
    """Where the runs' pilots start: ``names`` (None: this machine) through ``command``, and
    the ``address`` at which they reach this driver."""

    names: list[str] | None = None
    command: str = ""
    address: str = "127.0.0.1"


def note(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- this run's processes and the machine's other load ----------------------------------------


def _marker() -> str:
    return f"{MARK}={os.environ[MARK]}"


def _wait_gone(timeout: float) -> list[int]:
    deadline = time.time() + timeout
    while (left := marked(_marker())) and time.time() < deadline:
        time.sleep(0.5)
    return left


# --- calibration ------------------------------------------------------------------------------


@dataclass
class Calibration:
    rates: dict[int, float]  # world → samples/s sustained (checkpoints included)
    step_medians: dict[int, float]  # world → median of the step reports' rates (for reference)
    rescale: float  # median s from a fragment's stop to its successor's first step
    others: float  # cores used by other processes meanwhile

    def curve(self, nodes: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """As the executor's controller makes it: never less with more nodes."""
        rates: list[float] = []
        for n in range(1, nodes + 1):
            rates.append(max(self.rates[n], rates[-1] if rates else 0.0))
        return tuple(range(nodes + 1)), (0.0, *rates)


def _launch(
    world: int, d: Path, i: int, ckpt_every: int | None, cores: list[int] | None = None
) -> subprocess.Popen:
    """Fragment ``i`` of the task in ``d`` on ``world`` ranks (its own process group), on
    ``cores`` only if given (as the runs' pilots: ``pin_cores``)."""
    pin = ["taskset", "--cpu-list", ",".join(map(str, cores))] if cores else []
    argv = (
        pin
        + mpiexec_argv(world)
        + worker_argv(
            TASK,
            WORK,
            d / "checkpoints",
            OPTIONS,
            checkpoint_every=ckpt_every,
            report=d / "progress.jsonl",
            result=d / f"result-{i}.json",
        )
    )
    d.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with (d / f"run-{i}.log").open("w") as out:
        return subprocess.Popen(
            argv, cwd=d, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _stop_group(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM the launcher's process group (the ranks checkpoint), SIGKILL if it lingers."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _starts(d: Path) -> int:
    return sum(r["event"] == "start" for r in read_reports(d / "progress.jsonl"))


def calibrate(d: Path, nodes: int, seconds: float, ckpt_every: int | None) -> Calibration:
    """World 1, 2, …, nodes, then 1 again, each resumed from the last one's checkpoint, with
    nodes - w one-rank fillers (P(1): every 1-rank fragment's rate)."""
    main, load, rates, medians = d / "main", Load(_marker()), {}, {}
    worlds = [*range(1, nodes + 1), 1]
    for i, world in enumerate(worlds):
        last = i == len(worlds) - 1  # only its restart is measured
        fillers = [d / f"filler-{i}-{j}" for j in range(nodes - world)]
        # Each emulated node its own core, as the runs' pilots (pin_cores).
        pin = nodes <= (os.cpu_count() or 1) and shutil.which("taskset") is not None
        procs = [_launch(world, main, i, ckpt_every, list(range(world)) if pin else None)]
        procs += [
            _launch(1, f, 0, ckpt_every, [world + j] if pin else None)
            for j, f in enumerate(fillers)
        ]
        try:
            deadline = time.time() + 120
            while _starts(main) <= i or any(_starts(f) == 0 for f in fillers):
                if any(p.poll() is not None for p in procs) or time.time() > deadline:
                    raise SystemExit(f"calibration world {world} failed: see {d}")
                time.sleep(0.1)
            began = time.time()
            time.sleep(1.0 if last else seconds)
        finally:
            for proc in procs:
                _stop_group(proc)
        if not last:
            measured = [main, *fillers] if world == 1 else [main]
            profiles = [
                ScalingProfiler([r for r in read_reports(x / "progress.jsonl") if r["t"] >= began])
                for x in measured
            ]
            # Each fragment's spans on its own (they ran at once): together, one node's rate.
            spans = [span for p in profiles for span in p.spans[world]]
            rate = spans_rate(spans)
            if rate is None:
                raise SystemExit(f"calibration world {world}: no step reports: see {d}")
            rates[world] = rate
            medians[world] = statistics.median(x for p in profiles for x in p.rates[world])
            note(
                f"calibration: world {world} (+{len(fillers)} one-rank fillers): "
                f"{rates[world]:.0f} samples/s sustained, median step rate "
                f"{medians[world]:.0f} ({len(spans)} reports)"
            )
    rescale = ScalingProfiler(read_reports(main / "progress.jsonl")).rescale_s
    note("calibration: rescale (stop → first step) " + ", ".join(f"{x:.2f}" for x in rescale))
    return Calibration(rates, medians, statistics.median(rescale), load.others())


# --- real runs and the replay -----------------------------------------------------------------


@dataclass
class Run:
    figures: RunFigures
    others: float  # cores used by other processes during the run
    leftover: int  # processes of the run still alive after its shutdown


def real_run(name: str, window: Window, cal: Calibration, args, d: Path, hosts: Hosts, **kw) -> Run:
    """One run of the executor over the window, stopped at its end."""
    import parsl
    from parsl.config import Config

    from parsl_bf.executor import BackfillExecutor, elastic_app
    from parsl_bf.providers import LocalBackfillProvider

    nodes = window.nodes
    provider = LocalBackfillProvider(
        nodes=nodes,
        trace=str(TRACE),
        node_offset=window.node_offset,
        trace_start=float(window.start_s),
        time_scale=window.time_scale,
        known_holes=True,
        min_nodes=1,
        max_nodes=1,
        min_walltime="1",
        max_walltime="01:00:00",
        grace_s=5,
        max_blocks=2 * nodes,
        pin_cores=nodes <= (os.cpu_count() or 1),  # a node's start-up slows no other node
        hosts=hosts.names,
        host_command=hosts.command,
    )
    executor = BackfillExecutor(
        label="bf",
        provider=provider,
        allocator={"tfwd": args.tfwd},  # the milp policy (the default), as the replay
        checkpoint_every=args.checkpoint_every,
        walltime_notice_s=args.notice,
        rescale_s=cal.rescale,
        address=hosts.address,
        **kw,
    )
    _, curve = cal.curve(nodes)
    train = elastic_app(
        TASK,
        work=WORK,
        min_nodes=1,
        max_nodes=nodes,
        scaling={n: curve[n] for n in range(1, nodes + 1)},
        rescale_s=cal.rescale,
        executors=["bf"],
    )
    load = Load(_marker())
    parsl.load(Config(executors=[executor], strategy_period=1, run_dir=str(d / "runinfo")))
    try:
        for i in range(args.tasks):
            train(**OPTIONS, seed=i)
        deadline = time.time() + 60
        while not provider.pilots:  # the emulated clock starts at the first pilot request
            if time.time() > deadline:
                raise SystemExit("no pilot requested within 60 s")
            time.sleep(0.01)
        now = time.time()
        t0 = now - (provider.trace_time(now) - window.start_s) / window.time_scale
        t_end = t0 + window.duration_s
        note(f"{name}: window clock started; runs until +{window.duration_s:.0f} s")
        while (now := time.time()) < t_end:
            time.sleep(min(15.0, t_end - now))
            c = executor.controller
            tasks = ", ".join(f"{t.id}:{t.state}/{len(t.nodes)}" for t in c.elastic.values())
            note(f"{name}: +{time.time() - t0:.0f} s, pilots {len(c.pilots)}, tasks {tasks}")
    finally:
        parsl.dfk().cleanup()
    left = _wait_gone(provider.grace_s + 15)
    for pid in left:  # only ours (MARK): a pilot's process that outlived its cancel
        note(f"{name}: process {pid} left after shutdown: killing it")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    fig = run_figures(*load_run(executor.directory), t0, t_end, BATCH)
    note(f"{name}: {fig.samples} samples, {fig.fragments} fragments, {fig.pilots} pilots")
    return Run(fig, load.others(), len(left))


def replay_window(
    window: Window,
    cal: Calibration,
    tasks: int,
    tfwd: float,
    charge_starts: bool = False,
    costs: Costs | None = None,
) -> dict:
    """The simulator's prediction, on the trace's own seconds (see the module docstring);
    ``costs``: the start and rescale costs to charge (wall s), None: the calibration's
    rescale for both."""
    from parsl_bf.allocation import Objective
    from parsl_bf.inputs.trace import load_trace
    from parsl_bf.replay.jobsets import Job
    from parsl_bf.replay.policies import make_policy
    from parsl_bf.replay.simulator import ReplayConfig, replay

    scale = window.time_scale
    nodes, curve = cal.curve(window.nodes)
    per_trace_s = tuple(x / scale for x in curve)
    rescale = (cal.rescale if costs is None else costs.rescale) * scale
    start = None if costs is None else costs.start * scale
    jobs = [
        Job(
            id=f"t{i + 1}",
            model="digits_cnn",
            submit_s=0.0,
            min_nodes=1,
            max_nodes=window.nodes,
            rescale_up_s=rescale,
            rescale_down_s=rescale,
            work=float(WORK),
            nodes=nodes,
            throughput=per_trace_s,
            value=per_trace_s,
            start_s=start,
        )
        for i in range(tasks)
    ]
    # The replay's in-place costs are wall seconds: on the trace's clock, × scale as R.
    in_place = {
        k: getattr(ReplayConfig, k) * scale for k in ("preemption_shrink_s", "rescale_in_place_s")
    }
    config = ReplayConfig(
        tfwd=tfwd * scale,
        # Explicit: the figures in docs/executor.md were replayed with the objective that was
        # ReplayConfig's default then, throughput (the runs use the executor's default,
        # speedup_balanced); ReplayConfig now defaults to the executor's settings.
        objective=Objective.THROUGHPUT,
        start_s=window.start_s,
        end_s=window.end_s,
        charge_starts=charge_starts,
        **in_place,
    )
    trace = load_trace(TRACE, window.nodes, window.node_offset)
    summary = replay(trace, jobs, make_policy("milp"), config).summary
    summary["idle_node_s"] /= scale  # wall seconds, as the real runs
    summary["alloc_node_s"] /= scale
    return summary


@dataclass(frozen=True)
class Costs:
    """What the real runs paid (wall s, medians): ``start``, a fragment start on nodes its task
    did not hold (launch → first step); ``rescale``, a warm hand-over (predecessor's stop →
    successor's first step); ``source`` says where each came from."""

    start: float
    rescale: float
    source: str


def measured_costs(figures: list[RunFigures], cal: Calibration) -> Costs:
    """The runs' own start and rescale costs, for the replay that charges them; where the runs
    measured none, the calibration's rescale cost stands in."""
    fresh = [x for f in figures for x in f.fresh_startup_s]
    handover = [x for f in figures for x in f.handover_s]
    start = statistics.median(fresh) if fresh else cal.rescale
    rescale = statistics.median(handover) if handover else cal.rescale
    source = (
        f"start {'runs, ' + str(len(fresh)) if fresh else 'calibration'}; "
        f"rescale {'runs, ' + str(len(handover)) if handover else 'calibration'}"
    )
    return Costs(start, rescale, source)


# --- main -------------------------------------------------------------------------------------


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _f(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def _impossible(rows: dict[str, dict], rates: dict[int, float]) -> tuple[list[dict], list[dict]]:
    """Figures that cannot stand, taken out of the table and the JSON line (None) and listed
    instead: (impossible, undefined).

    Impossible: an efficiency above what the calibrated curve allows (max over n of P(n) /
    (n·P(1)); 1 when scaling is sublinear: P(1) was measured under other contention than the
    run), or a real run's below 0. Undefined: a replay's below 0. The original's accounting
    charges each preemption R·P(c) whatever the task trained since, so in a window short
    against its rescale costs (``--quick``) the charges can exceed the training; that says
    the window is too short for the replay, not that the code is wrong."""
    ceiling = max(v / (n * rates[1]) for n, v in rates.items() if n > 0)
    found, undefined = [], []
    for name, r in rows.items():
        for key in ("E_used", "E_avail", "E_avail_run"):
            if r.get(key) is None or 0 <= r[key] <= ceiling:
                continue
            bad = {"run": name, "figure": key, "value": round(r[key], 4)}
            if name.startswith("replay") and r[key] < 0:
                undefined.append(bad | {"why": "its preemption charges exceed its training"})
            else:
                found.append(bad | {"ceiling": round(ceiling, 4)})
            r[key] = None
    return found, undefined


P1_DRIFT = 0.10  # a run's own P(1) this far from the calibration's: other contention


def noise(rows: dict[str, dict], p1: float, drift: bool = True) -> list[str]:
    """Why the run's figures are not to be trusted, [] if nothing says so: an efficiency above
    1 + ``E_SLACK`` (no node does more than one node's work), or a run whose own P(1) (its
    1-rank fragments' sustained rate) differs from the calibration's by more than
    ``P1_DRIFT`` (the two were measured under different contention, so E, which divides by
    the calibration's P(1), is off by as much); ``drift=False`` where E divides by the run's
    own P(1) instead."""
    reasons = []
    for name, r in rows.items():
        for key in ("E_used", "E_avail", "E_avail_run"):
            if r.get(key) is not None and r[key] > 1 + E_SLACK:
                reasons.append(f"{name} {key} {r[key]:.3f} > {1 + E_SLACK:g}")
        own = r.get("rate1")
        if drift and own and abs(own - p1) > P1_DRIFT * p1:
            reasons.append(
                f"{name} P(1) {own:.0f} samples/s is {own / p1 - 1:+.0%} off the "
                f"calibration's {p1:.0f}"
            )
    return reasons


@contextlib.contextmanager
def hosts_for_pilots(count: int) -> Iterator[Hosts]:
    """``count`` separate hosts for the runs' pilots, up while the runs last."""
    with separate_hosts(count, HOSTS_DIR, HOSTS_PORTS) as env:
        names = [f"n{i}" for i in range(1, count + 1)]
        yield Hosts(names, host_command(env), env["PARSL_BF_ADDRESS"])


def measure(window: Window, args, tmp: Path, hosts: Hosts):
    """The calibration (on this machine), the three runs (pilots on ``hosts``) and both
    replays; the run directory goes afterwards unless ``--keep``."""
    try:
        wait_quiet(_marker(), args.quiet_wait, note)
        cal = calibrate(tmp / "calibration", args.nodes, args.calibrate_s, args.checkpoint_every)
        runs: dict[str, Run] = {}
        aware_life = 2 * cal.rescale
        for name, life, warm in (
            ("aware", aware_life, True),
            ("paper", 0.0, True),
            ("cold", aware_life, False),
        ):
            wait_quiet(_marker(), args.quiet_wait, note)
            note(f"{name}: min_node_life_s {life:.1f}, warm_rescale {warm}")
            kw = {"min_node_life_s": life, "warm_rescale": warm}
            runs[name] = real_run(name, window, cal, args, tmp / name, hosts, **kw)
        rep = replay_window(window, cal, args.tasks, args.tfwd)
        # replay+ charges what the runs themselves paid (aware and paper: warm rescales).
        costs = measured_costs([runs["aware"].figures, runs["paper"].figures], cal)
        rep_charged = replay_window(
            window, cal, args.tasks, args.tfwd, charge_starts=True, costs=costs
        )
    finally:
        left = _wait_gone(10)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        if args.keep:
            note(f"run directory kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    return runs, cal, rep, rep_charged, costs, left


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2, help="emulated nodes (default 2: the cores)")
    ap.add_argument("--duration", type=float, default=150.0, help="window, wall s (default 150)")
    ap.add_argument(
        "--tasks", type=int, help="elastic tasks (default 3, or --nodes if more: every node busy)"
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="15 s window, 5 s holes, 3 s calibration phases, quiet wait <= 5 s",
    )
    ap.add_argument(
        "--min-hole", type=float, help="shortest idle piece, wall s (default max(15, duration / 6))"
    )
    ap.add_argument("--calibrate-s", type=float, default=15.0, help="s per calibration world")
    ap.add_argument("--checkpoint-every", type=int, help="steps (default: the executor's, auto)")
    ap.add_argument("--notice", type=float, default=1.0, help="walltime_notice_s (default 1)")
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=60.0,
        help="before the calibration and each run, wait up to this many s for other processes "
        "to use < 0.5 cores (default 60; 0: don't)",
    )
    ap.add_argument(
        "--hosts",
        type=int,
        default=0,
        help="run the pilots on this many separate hosts (root: a loopback cluster of network "
        "namespaces, brought up and down here; node i on host i mod HOSTS); 0: this machine",
    )
    ap.add_argument(
        "--min-changes",
        type=int,
        help="node changes the window must have: shorter holes until it does (default 20 with "
        "--hosts, else 0)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the run directory")
    args = ap.parse_args()
    if args.hosts < 0 or args.hosts > args.nodes:
        ap.error(f"--hosts: 0 (this machine) to --nodes ({args.nodes})")
    args.tasks = args.tasks or max(3, args.nodes)
    if args.min_changes is None:
        args.min_changes = 20 if args.hosts and not args.quick else 0
    if args.quick:
        # A smoke run of every path (calibration, three runs, both replays) in about 80 s;
        # holes of 5 s still give the runs several node changes.
        args.duration, args.calibrate_s = 15.0, 3.0
        args.quiet_wait = min(args.quiet_wait, 5.0)
        args.min_hole = args.min_hole or 5.0
    min_hole = args.min_hole or max(15.0, args.duration / 6)

    from parsl_bf.inputs.trace import load_trace

    os.environ["PARSL_BF_THREADS_PER_RANK"] = "1"  # a node is a core: one torch thread a rank
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
    )
    full = load_trace(TRACE)
    try:
        window = choose_window(full, args.nodes, args.duration, min_hole)
        # Shorter holes until the window has the node changes asked for (not below 10 s: a
        # hole must outlast a fragment's start-up and its stop).
        while window.changes < args.min_changes and args.min_hole is None and min_hole > 10:
            min_hole = max(10.0, 0.8 * min_hole)
            window = choose_window(full, args.nodes, args.duration, min_hole)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if window.changes < args.min_changes:
        note(f"this window has {window.changes} node changes, fewer than --min-changes")
    names = full.nodes[window.node_offset : window.node_offset + window.nodes]
    idle = window.idle_node_s
    args.tfwd = statistics.median(window.holes_wall())
    head = (
        f"window: {window.nodes} nodes from {window.node_offset} ({', '.join(names)}), "
        f"trace s {window.start_s}..{window.end_s} × 1/{window.time_scale:.2f} = "
        f"{window.duration_s:.0f} wall s, {window.changes} changes, idle {idle:.0f} node-s\n"
        + window.describe(names)
    )
    note(head)

    # A SIGTERM ends the run as Ctrl-C does: every process it started killed, its hosts removed.
    sigterm_as_interrupt()
    tmp = Path(tempfile.mkdtemp(prefix="bench-executor-"))
    with contextlib.ExitStack() as stack:
        hosts = Hosts()
        if args.hosts:
            hosts = stack.enter_context(hosts_for_pilots(args.hosts))
            note(f"pilots on {args.hosts} hosts: {', '.join(hosts.names or [])}")
        # Only now: the hosts' daemons are not this run's processes (they are never killed).
        os.environ[MARK] = uuid.uuid4().hex
        runs, cal, rep, rep_charged, costs, left = measure(window, args, tmp, hosts)
    p1, aware_life = cal.rates[1], 2 * cal.rescale
    # More nodes than cores: the nodes share the cores, as many ways as pilots are up at the
    # time, so a rank's rate follows the run's pilots, not the calibration's fillers. P(1) is
    # then the run's own (its 1-rank fragments' sustained rate, measured under its sharing),
    # which keeps E at or under util; otherwise each node has its core, and P(1) the
    # calibration's.
    shared = window.nodes > (os.cpu_count() or 1)
    rows = {}
    for name, run in runs.items():
        r = run.figures
        rate1 = r.sustained1
        rows[name] = {
            "samples": r.samples,
            **efficiency(r.samples, rate1 if shared and rate1 else p1, r.alloc_node_s, idle),
            "held": r.held_node_s / idle,
            "lost": r.lost,
            "preempt": r.preemptions,
            "p50": percentile(r.decisions, 50),
            "p95": percentile(r.decisions, 95),
            "rate1": rate1,
            "others": run.others,
            "E_avail_run": r.samples / rate1 / idle if rate1 else None,
        }
    for name, r in (("replay", rep), ("replay+", rep_charged)):
        rows[name] = {
            **{k: r[k] for k in ("samples", "util", "E_used", "E_avail")},
            **{"held": None, "lost": r["preemption_loss_samples"], "preempt": r["preemptions"]},
            **{"p50": None, "p95": None, "rate1": p1, "others": cal.others},
            "E_avail_run": r["E_avail"],
        }

    noisy = noise(rows, p1, drift=not shared)  # before _impossible takes figures out
    impossible, undefined = _impossible(rows, cal.rates)
    noisy += [f"{u['run']} {u['figure']} {u['value']}: {u['why']}" for u in undefined]
    print(head)
    curve = ", ".join(f"P({n}) {v:.0f}" for n, v in sorted(cal.rates.items()))
    medians = ", ".join(f"{v:.0f}" for _, v in sorted(cal.step_medians.items()))
    print(
        f"calibration: {curve} samples/s sustained (median step rates {medians}); "
        f"rescale {cal.rescale:.2f} s; "
        f"T_fwd {args.tfwd:.1f} s; aware min_node_life_s {aware_life:.1f} s; other "
        f"processes used {cal.others:.2f} cores meanwhile\n"
    )
    print(
        f"{'run':>7} {'samples':>9} {'util':>5} {'held':>5} {'E_used':>6} {'E_avail':>7} "
        f"{'E_av*':>5} {'lost':>6} {'preempt':>7} {'dec p50':>7} {'dec p95':>7} "
        f"{'P(1) run':>8} {'others':>6}"
    )
    for name, r in rows.items():
        print(
            f"{name:>7} {r['samples']:>9.0f} {r['util']:>5.3f} {_f(r['held'], '.3f'):>5} "
            f"{_f(r['E_used'], '.3f'):>6} {_f(r['E_avail'], '.3f'):>7} "
            f"{_f(r['E_avail_run'], '.3f'):>5} "
            f"{r['lost']:>6.0f} {r['preempt']:>7} {_f(r['p50'], '.4f'):>7} "
            f"{_f(r['p95'], '.4f'):>7} {_f(r['rate1'], '.0f'):>8} {r['others']:>6.2f}"
        )
    aware, paper, cold = rows["aware"], rows["paper"], rows["cold"]
    replayed = rows["replay"]  # as the table: an impossible figure is None
    ratio = _div(aware["E_avail"], replayed["E_avail"])
    startup = runs["aware"].figures.startup_s + runs["paper"].figures.startup_s
    waited = runs["aware"].figures.waited_s + runs["paper"].figures.waited_s
    print(
        f"\nreal / replay (target: within 10 %): aware E_avail {_f(ratio, '.3f')} "
        f"(E_av* {_f(_div(aware['E_avail_run'], replayed['E_avail']), '.3f')}), util "
        f"{_f(_div(aware['util'], rep['util']), '.3f')}; paper E_avail "
        f"{_f(_div(paper['E_avail'], replayed['E_avail']), '.3f')} (E_av* "
        f"{_f(_div(paper['E_avail_run'], replayed['E_avail']), '.3f')}); aware E_avail against "
        f"replay+ (starts charged) {_f(_div(aware['E_avail'], rows['replay+']['E_avail']), '.3f')}"
    )
    print(
        f"in the runs: fragment start → first step, median "
        f"{_f(statistics.median(startup) if startup else None, '.2f')} s over {len(startup)}; "
        f"predecessor's stop → first step (the controller's 'rescale'), median "
        f"{_f(statistics.median(waited) if waited else None, '.2f')} s over {len(waited)}"
    )
    decided = {
        kind: [x for name in ("aware", "paper") for x in runs[name].figures.rescale_s[kind]]
        for kind in RESCALES
    }
    print(
        "in the runs, rescales from the controller's decision to the first step at the new size "
        "(through the executor, the channel, the agent and the ranks), median over aware and "
        "paper: "
        + "; ".join(
            f"{kind.replace('_', ' ')} {_f(statistics.median(v) if v else None, '.2f')} s "
            f"over {len(v)}"
            for kind, v in decided.items()
        )
    )
    print(
        "replay: the replay's accounting (a start from 0 nodes is free, rescales charged "
        "the calibration's cost); replay+: the costs the aware and paper runs paid, a start "
        f"from 0 nodes {costs.start:.2f} s × P(n) and a rescale {costs.rescale:.2f} s × P(c) "
        f"({costs.source}); "
        "held = pilot node-s / idle node-s; P(n): samples/s sustained between step reports, "
        "checkpoints included; E_av* = E_avail with P(1) run (the rate the run's 1-rank "
        "fragments sustained; replay: the calibration's) instead of the calibration's "
        "P(1); decisions in s; replay lost = its preemption charge R·P; others = cores used by "
        "other processes on the machine (replay: during the calibration)"
    )
    for bad in impossible:
        why = (
            "below 0"
            if bad["value"] < 0
            else f"above {bad['ceiling']}, the most the calibrated curve allows (P(1) was "
            "measured under other contention than the run)"
        )
        print(f"IMPOSSIBLE, left out: {bad['run']} {bad['figure']} {bad['value']} is {why}")
    for reason in noisy:
        print(f"NOISY: {reason}")
    decisions = [x for run in runs.values() for x in run.figures.decisions]
    figures = {
        "E_avail": _r(aware["E_avail"]),
        "E_avail_replay": _r(replayed["E_avail"]),
        "hosts": args.hosts or 1,
        "nodes": window.nodes,
        "decision_p50_s": _r(percentile(decisions, 50)),
        "decision_p95_s": _r(percentile(decisions, 95)),
        "lost_samples_aware": aware["lost"],
        "lost_samples_paper": paper["lost"],
        "E_avail_ratio": _r(ratio or None),
        "E_avail_replay_starts_charged": _r(rows["replay+"]["E_avail"]),
        "E_avail_paper": _r(paper["E_avail"]),
        "E_avail_cold": _r(cold["E_avail"]),
        "E_avail_run_P1": {
            k: _r(rows[k]["E_avail_run"] or None) for k in ("aware", "paper", "cold")
        },
        "util": round(aware["util"], 4),
        "util_paper": round(paper["util"], 4),
        "util_replay": round(rep["util"], 4),
        "samples_aware": aware["samples"],
        "samples_paper": paper["samples"],
        "samples_cold": cold["samples"],
        "samples_replay": round(rep["samples"]),
        "preemptions_aware": aware["preempt"],
        "preemptions_paper": paper["preempt"],
        "decisions": len(decisions),
        "P1_in_run": {k: round(rows[k]["rate1"] or 0.0, 1) for k in runs},
        "other_cores": {
            "calibration": round(cal.others, 2),
            **{k: round(run.others, 2) for k, run in runs.items()},
        },
        "P1_source": "run" if shared else "calibration",
        "P_samples_per_s": {str(k): round(v, 1) for k, v in cal.rates.items()},
        "P_median_step_samples_per_s": {str(k): round(v, 1) for k, v in cal.step_medians.items()},
        "rescale_s": round(cal.rescale, 3),
        "replay_charged_costs_s": {
            "start": round(costs.start, 3),
            "rescale": round(costs.rescale, 3),
            "source": costs.source,
        },
        "fragment_startup_s": round(statistics.median(startup), 3) if startup else None,
        "rescale_from_decision_s": {
            kind: _r(statistics.median(v), 3) if v else None for kind, v in decided.items()
        },
        "rescales_from_decision": {kind: len(v) for kind, v in decided.items()},
        "window": {
            "node_offset": window.node_offset,
            "nodes": window.nodes,
            "trace_start": window.start_s,
            "trace_s": window.length_s,
            "time_scale": round(window.time_scale, 4),
            "changes": window.changes,
            "idle_node_s": round(idle, 1),
        },
        "leftover_processes": sum(run.leftover for run in runs.values()) + len(left),
        "impossible": impossible,
        "replay_undefined": undefined,
        "noisy": bool(noisy),
        "noisy_reasons": noisy,
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
