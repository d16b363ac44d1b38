"""End to end: the BackfillExecutor on the local emulation of a replayed trace window, against
the replay simulator's prediction for the same window.

What it measures, in one run (``--quick``: a shorter window and calibration):

1. **Window.** ``--nodes`` emulated nodes, consecutive in ``tests/data/trace64`` (as the
   provider's ``node_offset`` takes them). Chosen by code: of all windows of those nodes whose
   idle pieces (holes clipped to the window) each last at least ``--min-hole`` wall seconds
   and that are at least 40 % idle, the one with the most distinct times at which one of its
   nodes changes state (events the allocator reacts to; ties: more changes, then more idle);
   lengths from 2× to 100× ``--duration`` trace seconds, ``time_scale`` = length ÷ duration,
   so the window lasts ``--duration`` wall seconds. Holes too short to start a fragment in
   would measure start-up cost, not allocation.
2. **Calibration** of the example task (``digits_cnn``, width 8, global batch 64) with real
   ``mpiexec`` ranks, run like the executor runs them: world 1, 2, …, ``--nodes``, then 1
   again, each resumed from the previous one's checkpoint after a SIGTERM → P(w) (median of
   the step reports) and the rescale cost (a successor's ``first_step_at - stopped_at``).
   While a world-w fragment is measured, nodes − w one-rank "filler" fragments keep the other
   cores busy, as the other emulated nodes are in the runs (P(1) is then a node's rate on a
   fully used machine, not on an idle one).
3. **Real runs**, three times on the same window: walltime-aware (``min_node_life_s`` = 2 ×
   the calibrated rescale cost), the paper's model (``min_node_life_s=0``), both with warm
   rescales, and "cold": walltime-aware with ``warm_rescale=False``; ``--tasks``
   elastic tasks (1..nodes nodes, the calibrated curve as their scaling guess, work far beyond
   the window), stopped at the window's end (``parsl.dfk().cleanup()``). From the executor's
   ``events.jsonl`` and the tasks' ``progress.jsonl``: samples done by the window end (each
   task's last report before it), allocated node-seconds (fragment start → its processes
   exited), pilot node-seconds ("held"), lost samples (for each ``start`` report after the
   first: the most samples reported before it − (its samples − one global batch); a first
   step at an epoch's end is shorter, so this may count up to 63 samples too many),
   preemptions (fragments stopped because their pilot ended or was preempted), and the
   decision latency (``decision`` events: event → plan applied).
4. **Replay** of the same nodes and window with the same tasks as ``Job``s (calibrated P(w) and
   rescale cost), the milp policy and the executor's T_fwd. Instead of rounding the trace to
   whole wall seconds, the replay runs on the trace's own (integer) seconds with rates ÷
   time_scale, rescale cost and T_fwd × time_scale: the same window exactly; util and the
   efficiencies are ratios, so they do not depend on the unit.

Accounting as in docs/replay.md ("Accounting"): util = allocated ÷ idle
node-seconds; E_used = Σ samples / P(1) ÷ allocated node-seconds; E_avail = the same numerator
÷ idle node-seconds (of the window, from the trace). A pilot holds its node until its processes
have exited after the SIGTERM at its hole's end, so util (and "held") can exceed 1 slightly.
"E_av*" is E_avail with the run's own P(1) (median step rate of its 1-rank fragments) in place
of the calibration's: it leaves out how much slower the ranks ran during the run.

Emulation choices (and why):
- A node is a core: the default ``--nodes 2`` on this 2-core machine. The worker gives each
  rank ``cpu_count // ranks on this host`` torch threads, i.e. all the machine's cores to a
  1-rank fragment; two such fragments on two emulated nodes would then oversubscribe the
  cores and, for this tiny model, a 2-thread rank is several times slower than a 1-thread
  one. So the ranks run through a small ``mpiexec`` wrapper (written to the run directory)
  that starts this file with ``--rank``: one intra-op thread per rank, then the worker's
  ``main`` unchanged. Calibration runs the same way.
- Pilots of one node each (``max_nodes=1``): a multi-node pilot lasts as long as its
  shortest hole, which would cut the others' holes short; the replay has per-node holes.
  Fragments on two nodes span two pilots (the executor's rendezvous).
- ``known_holes=True``: a pilot's walltime is its hole (as a scheduler's planned start);
  ``walltime_notice_s`` ``--notice`` (1 s: the ranks checkpoint in milliseconds on SIGTERM).
- T_fwd: the median idle piece of the window (wall seconds), for the executor and the replay.

The real system pays what the replay does not: a fragment started on a fresh pilot (0 → n
nodes) costs its process start-up (imports, model) and the pilot's own start, where the
replay's rescale charge R·P(c) is 0 for c = 0; and its ranks share the cores with the
executor, the agents and Parsl. So the replay is run twice: "replay" with the original's
accounting (the ``E_avail_replay`` of the JSON line), and "replay+" with ``charge_starts``
(a start from 0 nodes charged R_up·P(n)).

The machine may be shared: other processes' CPU time slows the ranks, so it is measured
(``/proc/stat`` less this process and the ones it started, sampled every 0.5 s) for the
calibration and each run ("others", in cores), and before each of them the benchmark waits up
to ``--quiet-wait`` s for it to drop under 0.5 cores. "P(1) run" (median step rate of the
runs' 1-rank fragments) next to the calibration's P(1) shows how much slower the ranks ran.
Figures measured while others use a good part of the cores mostly measure them.

Prints a table (rows aware / paper / cold / replay / replay+) and ends with one JSON line,
whose first keys are ``E_avail`` (the aware run), ``E_avail_replay``, ``decision_p50_s`` and
``decision_p95_s`` (all decisions of the runs: the same code path), ``lost_samples_aware``,
``lost_samples_paper``. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from parsl_bf.training.command import mpiexec_argv, worker_argv

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "data" / "trace64"
TASK = "parsl_bf.training.examples:digits_cnn"
BATCH = 64
OPTIONS = {"lr": 0.05, "width": 8, "global_batch": BATCH}
WORK = 10**10  # samples per task: far beyond any window
MARK = "PARSL_BF_EXECUTOR_BENCH"  # in the environment of every process this run starts
LEAVING = ("walltime", "preempted", "pilot gone")  # fragment_stop reasons that are preemptions


def note(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Load:
    """CPU used by processes other than this benchmark's, in cores, from creation to
    :meth:`others`: other work on the machine slows the ranks. This benchmark's processes
    (pilots outlive their reaped parents, so children's times would miss them) are sampled
    every 0.5 s by the ``MARK`` in their environment."""

    def __init__(self) -> None:
        self.cpu: dict[int, float] = {}  # pid → CPU seconds, last seen
        self.base = self._scan()  # CPU seconds of our processes already running
        self.start = self._machine()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    @staticmethod
    def _machine() -> tuple[float, float, float]:
        ticks = os.sysconf("SC_CLK_TCK")
        cpu = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        busy = (sum(cpu) - cpu[3] - cpu[4]) / ticks  # all but idle and iowait
        t = os.times()
        return time.time(), busy, t.user + t.system

    def _scan(self) -> float:
        ticks = os.sysconf("SC_CLK_TCK")
        for pid in _ours():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            self.cpu[pid] = (int(fields[11]) + int(fields[12])) / ticks
        return sum(self.cpu.values())

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            self._scan()

    def others(self) -> float:
        self._stop.set()
        self._thread.join()
        ours = self._scan() - self.base
        (w0, b0, s0), (w1, b1, s1) = self.start, self._machine()
        return max(0.0, ((b1 - b0) - (s1 - s0) - ours) / max(1e-9, w1 - w0))


def wait_quiet(max_wait: float, threshold: float = 0.5, probe: float = 2.0) -> float:
    """Wait (up to ``max_wait`` s) until other processes use less than ``threshold`` cores over
    a ``probe`` s sample; the machine is shared and its other work slows the ranks. Returns
    the last sample."""
    deadline = time.time() + max_wait
    while True:
        load = Load()
        time.sleep(probe)
        others = load.others()
        if others < threshold or time.time() >= deadline:
            if others >= threshold:
                note(f"other processes still use {others:.2f} cores: measuring anyway")
            return others
        note(f"other processes use {others:.2f} cores: waiting for a quieter machine")


# --- ranks: one intra-op thread each (a node is a core) ---------------------------------------


def rank_main(argv: list[str]) -> int:
    """A fragment's rank as ``parsl_bf.training.worker`` runs it, with one torch thread."""
    import torch

    torch.set_num_threads(1)
    torch.set_num_threads = lambda n: None  # the worker's own choice: all the host's cores
    from parsl_bf.training.worker import main as worker_main

    return worker_main(argv)


def write_mpiexec(directory: Path) -> Path:
    """An ``mpiexec`` that runs ``-m parsl_bf.training.worker`` ranks as :func:`rank_main`."""
    real = Path(sys.executable).with_name("mpiexec")
    path = directory / "mpiexec"
    path.write_text(
        "#!/bin/sh\n"
        "# mpiexec -n N PYTHON -m parsl_bf.training.worker ARGS: one torch thread per rank\n"
        'if [ "$4" = "-m" ] && [ "$5" = "parsl_bf.training.worker" ]; then\n'
        '  n="$2"; py="$3"; shift 5\n'
        f'  exec "{real}" -n "$n" "$py" "{Path(__file__).resolve()}" --rank "$@"\n'
        "fi\n"
        f'exec "{real}" "$@"\n'
    )
    path.chmod(0o755)
    return path


def fragment_argv(mpiexec: Path, world: int, d: Path, result: str, checkpoint_every: int) -> list:
    return mpiexec_argv(world, mpiexec=str(mpiexec)) + worker_argv(
        TASK,
        WORK,
        d / "checkpoints",
        OPTIONS,
        checkpoint_every=checkpoint_every,
        report=d / "progress.jsonl",
        result=d / result,
    )


# --- the window -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """``nodes`` nodes from ``node_offset``, trace seconds [start_s, start_s + length_s]."""

    node_offset: int
    nodes: int
    start_s: int
    length_s: int
    duration_s: float
    changes: int
    pieces: tuple[tuple[tuple[float, float], ...], ...]  # per node: idle (a, b), trace s

    @property
    def time_scale(self) -> float:
        return self.length_s / self.duration_s

    @property
    def end_s(self) -> int:
        return self.start_s + self.length_s

    def wall(self, t: float) -> float:
        """Wall seconds after the window's start at trace second ``t``."""
        return (t - self.start_s) / self.time_scale

    @property
    def idle_node_s(self) -> float:
        """Idle node-seconds of the window, in wall seconds."""
        return sum(b - a for p in self.pieces for a, b in p) / self.time_scale

    def holes_wall(self) -> list[float]:
        return [(b - a) / self.time_scale for p in self.pieces for a, b in p]

    def describe(self, names: tuple[str, ...]) -> str:
        lines = []
        for name, p in zip(names, self.pieces, strict=True):
            holes = ", ".join(f"{self.wall(a):.0f}-{self.wall(b):.0f}" for a, b in p)
            lines.append(f"  {name}: idle {holes or 'never'} s")
        return "\n".join(lines)


def idle_intervals(trace) -> list:
    """Per node of ``trace``: its idle intervals (a, b) in trace seconds, as an (n, 2) array."""
    import numpy as np

    out = []
    for i in range(len(trace.nodes)):
        m = trace.change_node == i
        start = 0 if trace.initial[i] else None
        rows = []
        for t, idle in zip(trace.change_t[m].tolist(), trace.change_idle[m].tolist(), strict=True):
            if idle and start is None:
                start = t
            elif not idle and start is not None:
                rows.append((start, t))
                start = None
        if start is not None:
            rows.append((start, trace.end_s))
        out.append(np.array(rows, dtype=float).reshape(-1, 2))
    return out


def choose_window(trace, nodes: int, duration: float, min_hole: float) -> Window:
    """The window with the most change times among those whose idle pieces all last
    ``min_hole`` wall seconds or more and that are at least 40 % idle (module docstring)."""
    import numpy as np

    intervals = idle_intervals(trace)
    lengths = np.unique(np.round(np.geomspace(2 * duration, 100 * duration, 30)).astype(int))
    best: tuple | None = None
    for offset in range(len(trace.nodes) - nodes + 1):
        group = intervals[offset : offset + nodes]
        # A window starts one trace second before one of these nodes changes state.
        starts = np.unique(np.concatenate([g.ravel() for g in group])) - 1
        starts = starts[starts >= 0]
        for length in lengths.tolist():
            scale = length / duration
            for s in starts.tolist():
                e = s + length
                if e > trace.end_s:
                    break
                idle, changes, times, pieces, ok = 0.0, 0, set(), [], True
                for g in group:
                    a, b = np.clip(g[:, 0], s, e), np.clip(g[:, 1], s, e)
                    keep = b > a
                    a, b = a[keep], b[keep]
                    if len(a) and (b - a).min() < min_hole * scale:
                        ok = False
                        break
                    idle += float((b - a).sum())
                    inside = [t for t in (*a.tolist(), *b.tolist()) if s < t < e]
                    changes += len(inside)
                    times.update(inside)
                    pieces.append(tuple(zip(a.tolist(), b.tolist(), strict=True)))
                if not ok or idle < 0.4 * nodes * length:
                    continue
                key = (len(times), changes, idle / (nodes * length), -length)
                if best is None or key > best[0]:
                    best = (key, offset, int(s), int(length), tuple(pieces))
    if best is None:
        raise SystemExit(f"no window of {nodes} nodes with holes of {min_hole} s or more")
    (_, changes, _, _), offset, s, length, pieces = best
    return Window(offset, nodes, s, length, duration, changes, pieces)


# --- calibration ------------------------------------------------------------------------------


@dataclass
class Calibration:
    rates: dict[int, float]  # world → samples/s
    rescale_s: list[float]
    others: float  # cores used by other processes meanwhile

    @property
    def rescale(self) -> float:
        return statistics.median(self.rescale_s)

    def curve(self, nodes: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """As the executor's controller makes it: never less with more nodes."""
        rates: list[float] = []
        for n in range(1, nodes + 1):
            rates.append(max(self.rates[n], rates[-1] if rates else 0.0))
        return tuple(range(nodes + 1)), (0.0, *rates)


def _reports(path: Path) -> list[dict]:
    from parsl_bf.training.reports import read_reports

    return read_reports(path)


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


def _launch(argv: list, d: Path, log: str) -> subprocess.Popen:
    d.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with (d / log).open("w") as out:
        return subprocess.Popen(
            argv, cwd=d, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _starts(d: Path) -> int:
    return sum(r["event"] == "start" for r in _reports(d / "progress.jsonl"))


def calibrate(mpiexec: Path, d: Path, nodes: int, seconds: float, ckpt_every: int) -> Calibration:
    """World 1, 2, …, nodes, then 1 again, each resumed from the last one's checkpoint; while
    a world-w fragment runs, nodes - w one-rank "filler" fragments keep the other cores busy,
    as the other emulated nodes are in the real runs (P(1): every 1-rank fragment's rate)."""
    main = d / "main"
    load = Load()
    worlds = [*range(1, nodes + 1), 1]
    rates: dict[int, float] = {}
    for i, world in enumerate(worlds):
        last = i == len(worlds) - 1  # only its restart is measured
        procs = [
            _launch(
                fragment_argv(mpiexec, world, main, f"result-{i}.json", ckpt_every),
                main,
                f"run-{i}.log",
            )
        ]
        fillers = [d / f"filler-{i}-{j}" for j in range(nodes - world)]
        procs += [
            _launch(fragment_argv(mpiexec, 1, f, "result.json", ckpt_every), f, "run.log")
            for f in fillers
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
        if last:
            continue
        measured = [main, *fillers] if world == 1 else [main]
        steps = [
            r["rate"]
            for x in measured
            for r in _reports(x / "progress.jsonl")
            if r["t"] >= began and r["event"] == "step" and r.get("rate")
        ]
        rates[world] = statistics.median(steps)
        note(
            f"calibration: world {world} (+{len(fillers)} one-rank fillers): "
            f"{rates[world]:.0f} samples/s ({len(steps)} reports)"
        )
    starts = [r for r in _reports(main / "progress.jsonl") if r["event"] == "start"]
    rescale = [r["first_step_at"] - r["stopped_at"] for r in starts if r.get("stopped_at")]
    note("calibration: rescale (stop → first step) " + ", ".join(f"{x:.2f}" for x in rescale))
    return Calibration(rates, rescale, load.others())


# --- real runs --------------------------------------------------------------------------------


@dataclass
class RunResult:
    name: str
    samples: int = 0
    alloc_node_s: float = 0.0
    held_node_s: float = 0.0
    lost: int = 0
    preemptions: int = 0
    pilots: int = 0
    fragments: int = 0
    decisions: list[float] = field(default_factory=list)
    startup_s: list[float] = field(default_factory=list)  # fragment_start → its first step
    waited_s: list[float] = field(default_factory=list)  # predecessor's stop → first step
    per_task: dict[str, int] = field(default_factory=dict)
    rates1: list[float] = field(default_factory=list)  # step rates of 1-rank fragments
    others: float = 0.0  # cores used by other processes during the run
    leftover: int = 0


def _clip(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def analyse(name: str, directory: Path, t0: float, t_end: float) -> RunResult:
    """Figures of one run from its events and progress reports, over [t0, t_end] (wall)."""
    res = RunResult(name)
    events = [json.loads(x) for x in (directory / "events.jsonl").read_text().splitlines()]
    running: dict[str, tuple[float, int]] = {}  # task → (fragment start, nodes)
    launched: dict[str, list[float]] = {}  # task → its fragment_start times
    pilots: dict[str, tuple[float, int]] = {}
    for e in events:
        kind, t = e["event"], e["t"]
        if kind == "fragment_start":
            running[e["task"]] = (t, int(e["nodes"]))
            launched.setdefault(e["task"], []).append(t)
            res.fragments += t <= t_end
        elif kind in ("fragment_stopped", "task_done", "task_failed") and e["task"] in running:
            start, n = running.pop(e["task"])
            res.alloc_node_s += n * _clip(start, t, t0, t_end)
        elif kind == "pilot_up":
            pilots[e["pilot"]] = (t, len(e["nodes"]))
            res.pilots += t <= t_end
        elif kind == "pilot_gone" and e["pilot"] in pilots:
            start, n = pilots.pop(e["pilot"])
            res.held_node_s += n * _clip(start, t, t0, t_end)
        elif kind == "fragment_stop" and e.get("reason") in LEAVING and t <= t_end:
            res.preemptions += 1
        elif kind == "decision":
            res.decisions.append(float(e["seconds"]))
    res.alloc_node_s += sum(n * _clip(s, t_end, t0, t_end) for s, n in running.values())
    res.held_node_s += sum(n * _clip(s, t_end, t0, t_end) for s, n in pilots.values())
    for progress in sorted((directory / "tasks").glob("*/progress.jsonl")):
        task = progress.parent.name
        reports = [r for r in _reports(progress) if r["t"] <= t_end and "samples" in r]
        best = 0
        for r in reports:
            if r["event"] == "start" and best:
                res.lost += max(0, best - (r["samples"] - BATCH))
            if r["event"] == "start":
                before = [t for t in launched.get(task, []) if t <= r["first_step_at"]]
                if before:
                    res.startup_s.append(r["first_step_at"] - before[-1])
                if r.get("stopped_at"):
                    res.waited_s.append(r["first_step_at"] - r["stopped_at"])
            best = max(best, r["samples"])
            if r["event"] == "step" and r["world"] == 1 and r.get("rate") and r["t"] >= t0:
                res.rates1.append(r["rate"])
        done = reports[-1]["samples"] if reports else 0
        res.per_task[task] = done
        res.samples += done
    return res


def _ours() -> list[int]:
    """PIDs of live processes started by this run (they carry MARK in their environment)."""
    marker = f"{MARK}={os.environ[MARK]}".encode()
    me, found = os.getpid(), []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == me:
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in environ and state != "Z":
            found.append(int(proc.name))
    return found


def _wait_gone(timeout: float) -> list[int]:
    deadline = time.time() + timeout
    while (left := _ours()) and time.time() < deadline:
        time.sleep(0.5)
    return left


def real_run(name: str, window: Window, cal: Calibration, args, mpiexec: Path, d: Path, **kw):
    """One run of the executor over the window; stopped at its end. Returns its figures."""
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
    )
    executor = BackfillExecutor(
        label="bf",
        provider=provider,
        tfwd=args.tfwd,
        checkpoint_every=args.checkpoint_every,
        walltime_notice_s=args.notice,
        rescale_s=cal.rescale,
        mpiexec=str(mpiexec),
        **kw,
    )
    config = Config(executors=[executor], strategy_period=1, run_dir=str(d / "runinfo"))
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
    load = Load()
    dfk = parsl.load(config)
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
        next_note = t0 + 15
        while (now := time.time()) < t_end:
            time.sleep(min(0.2, t_end - now))
            if time.time() >= next_note:
                next_note += 15
                c = executor.controller
                tasks = ", ".join(f"{t.id}:{t.state}/{len(t.nodes)}" for t in c.elastic.values())
                note(f"{name}: +{time.time() - t0:.0f} s, pilots {len(c.pilots)}, tasks {tasks}")
    finally:
        dfk.cleanup()
    left = _wait_gone(provider.grace_s + 15)
    for pid in left:  # only ours (MARK): a pilot's process that outlived its cancel
        note(f"{name}: process {pid} left after shutdown: killing it")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    res = analyse(name, Path(executor.directory), t0, t_end)
    res.leftover, res.others = len(left), load.others()
    note(f"{name}: {res.samples} samples, {res.fragments} fragments, {res.pilots} pilots")
    return res


# --- the replay -------------------------------------------------------------------------------


def replay_window(
    window: Window, cal: Calibration, tasks: int, tfwd: float, charge_starts: bool = False
) -> dict:
    """The simulator's prediction, on the trace's own seconds (see the module docstring)."""
    from parsl_bf.replay.jobsets import Job
    from parsl_bf.replay.policies import make_policy
    from parsl_bf.replay.simulator import ReplayConfig, replay
    from parsl_bf.replay.trace import load_trace

    scale = window.time_scale
    trace = load_trace(TRACE, window.nodes, window.node_offset)
    nodes, curve = cal.curve(window.nodes)
    per_trace_s = tuple(x / scale for x in curve)
    jobs = [
        Job(
            id=f"t{i + 1}",
            model="digits_cnn",
            submit_s=0.0,
            min_nodes=1,
            max_nodes=window.nodes,
            rescale_up_s=cal.rescale * scale,
            rescale_down_s=cal.rescale * scale,
            work=float(WORK),
            nodes=nodes,
            throughput=per_trace_s,
            value=per_trace_s,
        )
        for i in range(tasks)
    ]
    config = ReplayConfig(
        tfwd=tfwd * scale, start_s=window.start_s, end_s=window.end_s, charge_starts=charge_starts
    )
    summary = replay(trace, jobs, make_policy("milp"), config).summary
    summary["idle_node_s"] /= scale  # wall seconds, as the real runs
    summary["alloc_node_s"] /= scale
    return summary


# --- main -------------------------------------------------------------------------------------


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def pct(xs: list[float], q: float) -> float | None:
    import numpy as np

    return float(np.percentile(xs, q)) if xs else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2, help="emulated nodes (default 2: the cores)")
    ap.add_argument("--duration", type=float, default=150.0, help="window, wall s (default 150)")
    ap.add_argument("--tasks", type=int, default=3, help="elastic tasks (default 3)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="60 s window, 6 s calibration phases, quiet wait <= 20 s",
    )
    ap.add_argument(
        "--min-hole", type=float, help="shortest idle piece, wall s (default max(15, duration / 6))"
    )
    ap.add_argument("--calibrate-s", type=float, default=15.0, help="s per calibration world")
    ap.add_argument("--checkpoint-every", type=int, default=20, help="steps (executor default)")
    ap.add_argument("--notice", type=float, default=1.0, help="walltime_notice_s (default 1)")
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=60.0,
        help="before the calibration and each run, wait up to this many s for other processes "
        "to use < 0.5 cores (default 60; 0: don't)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the run directory")
    args = ap.parse_args()
    if args.quick:
        args.duration, args.calibrate_s = 60.0, 6.0
        args.quiet_wait = min(args.quiet_wait, 20.0)
    min_hole = args.min_hole or max(15.0, args.duration / 6)

    from parsl_bf.replay.trace import load_trace

    os.environ[MARK] = uuid.uuid4().hex
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
    )
    full = load_trace(TRACE)
    window = choose_window(full, args.nodes, args.duration, min_hole)
    names = full.nodes[window.node_offset : window.node_offset + window.nodes]
    args.tfwd = statistics.median(window.holes_wall())
    note(
        f"window: nodes {window.node_offset}..{window.node_offset + window.nodes - 1} "
        f"({', '.join(names)}), trace s {window.start_s}..{window.end_s}, time_scale "
        f"{window.time_scale:.2f}, {window.changes} changes, idle "
        f"{window.idle_node_s:.0f} of {window.nodes * window.duration_s:.0f} node-s\n"
        + window.describe(names)
    )

    tmp = Path(tempfile.mkdtemp(prefix="bench-executor-"))
    try:
        mpiexec = write_mpiexec(tmp)
        wait_quiet(args.quiet_wait)
        cal = calibrate(
            mpiexec, tmp / "calibration", args.nodes, args.calibrate_s, args.checkpoint_every
        )
        runs = {}
        aware_life = 2 * cal.rescale
        for name, life, warm in (
            ("aware", aware_life, True),
            ("paper", 0.0, True),
            ("cold", aware_life, False),
        ):
            wait_quiet(args.quiet_wait)
            note(f"{name}: min_node_life_s {life:.1f}, warm_rescale {warm}")
            runs[name] = real_run(
                name,
                window,
                cal,
                args,
                mpiexec,
                tmp / name,
                min_node_life_s=life,
                warm_rescale=warm,
            )
        rep = replay_window(window, cal, args.tasks, args.tfwd)
        rep_charged = replay_window(window, cal, args.tasks, args.tfwd, charge_starts=True)
    finally:
        left = _wait_gone(10)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        if args.keep:
            note(f"run directory kept: {tmp}")
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)

    p1 = cal.rates[1]
    idle = window.idle_node_s
    rows = {}
    for name, r in runs.items():
        norm = r.samples / p1
        rows[name] = {
            "samples": r.samples,
            "util": r.alloc_node_s / idle,
            "held": r.held_node_s / idle,
            "E_used": norm / r.alloc_node_s if r.alloc_node_s else 0.0,
            "E_avail": norm / idle,
            "lost": r.lost,
            "preempt": r.preemptions,
            "p50": pct(r.decisions, 50),
            "p95": pct(r.decisions, 95),
            "rate1": statistics.median(r.rates1) if r.rates1 else None,
            "others": r.others,
        }
        rate1 = rows[name]["rate1"]
        rows[name]["E_avail_run"] = r.samples / rate1 / idle if rate1 else None
    for name, r in (("replay", rep), ("replay+", rep_charged)):
        rows[name] = {
            "samples": r["samples"],
            "util": r["util"],
            "held": None,
            "E_used": r["E_used"],
            "E_avail": r["E_avail"],
            "lost": r["preemption_loss_samples"],
            "preempt": r["preemptions"],
            "p50": None,
            "p95": None,
            "rate1": p1,
            "others": cal.others,
            "E_avail_run": r["E_avail"],
        }

    def f(x, spec):
        return "-" if x is None else format(x, spec)

    print(
        f"window: {window.nodes} nodes from {window.node_offset} ({', '.join(names)}), "
        f"trace s {window.start_s}..{window.end_s} × 1/{window.time_scale:.2f} = "
        f"{window.duration_s:.0f} wall s, {window.changes} changes, idle {idle:.0f} node-s"
    )
    print(window.describe(names))
    curve = ", ".join(f"P({n}) {v:.0f}" for n, v in sorted(cal.rates.items()))
    print(
        f"calibration: {curve} samples/s; rescale {cal.rescale:.2f} s; "
        f"T_fwd {args.tfwd:.1f} s; aware min_node_life_s {aware_life:.1f} s; other "
        f"processes used {cal.others:.2f} cores meanwhile"
    )
    print()
    print(
        f"{'run':>7} {'samples':>9} {'util':>5} {'held':>5} {'E_used':>6} {'E_avail':>7} "
        f"{'E_av*':>5} {'lost':>6} {'preempt':>7} {'dec p50':>7} {'dec p95':>7} "
        f"{'P(1) run':>8} {'others':>6}"
    )
    for name, r in rows.items():
        print(
            f"{name:>7} {r['samples']:>9.0f} {r['util']:>5.3f} {f(r['held'], '.3f'):>5} "
            f"{r['E_used']:>6.3f} {r['E_avail']:>7.3f} {f(r['E_avail_run'], '.3f'):>5} "
            f"{r['lost']:>6.0f} {r['preempt']:>7} {f(r['p50'], '.4f'):>7} "
            f"{f(r['p95'], '.4f'):>7} {f(r['rate1'], '.0f'):>8} {r['others']:>6.2f}"
        )
    aware, paper = rows["aware"], rows["paper"]
    ratio = aware["E_avail"] / rep["E_avail"] if rep["E_avail"] else None
    util_ratio = aware["util"] / rep["util"] if rep["util"] else None
    startup = runs["aware"].startup_s + runs["paper"].startup_s
    waited = runs["aware"].waited_s + runs["paper"].waited_s
    print(
        f"\nreal / replay (target: within 10 %): aware E_avail {f(ratio, '.3f')} "
        f"(E_av* {f(_div(aware['E_avail_run'], rep['E_avail']), '.3f')}), util "
        f"{f(util_ratio, '.3f')}; paper E_avail {f(_div(paper['E_avail'], rep['E_avail']), '.3f')}"
        f" (E_av* {f(_div(paper['E_avail_run'], rep['E_avail']), '.3f')}); aware E_avail against "
        f"replay+ (starts charged) {f(_div(aware['E_avail'], rep_charged['E_avail']), '.3f')}"
    )
    print(
        f"in the runs: fragment start → first step, median "
        f"{f(statistics.median(startup) if startup else None, '.2f')} s over {len(startup)}; "
        f"predecessor's stop → first step (the controller's 'rescale'), median "
        f"{f(statistics.median(waited) if waited else None, '.2f')} s over {len(waited)}"
    )
    print(
        "replay: the original's accounting (a start from 0 nodes is free); replay+: a start "
        "from 0 nodes charged R_up·P(n) (--charge-starts), as a real fragment's start-up; "
        "held = pilot node-s / idle node-s; E_av* = E_avail with P(1) run (the median step rate "
        "of the run's 1-rank fragments; replay: the calibration's) instead of the calibration's "
        "P(1); decisions in s; replay lost = its preemption charge R·P; others = cores used by "
        "other processes on the machine (replay: during the calibration)"
    )
    decisions = [x for r in runs.values() for x in r.decisions]
    leftover = sum(r.leftover for r in runs.values()) + len(left)
    figures = {
        "E_avail": round(aware["E_avail"], 4),
        "E_avail_replay": round(rep["E_avail"], 4),
        "decision_p50_s": round(pct(decisions, 50), 4),
        "decision_p95_s": round(pct(decisions, 95), 4),
        "lost_samples_aware": runs["aware"].lost,
        "lost_samples_paper": runs["paper"].lost,
        "E_avail_ratio": round(ratio, 4) if ratio else None,
        "E_avail_replay_starts_charged": round(rep_charged["E_avail"], 4),
        "E_avail_paper": round(paper["E_avail"], 4),
        "E_avail_cold": round(rows["cold"]["E_avail"], 4),
        "E_avail_run_P1": {
            k: round(rows[k]["E_avail_run"], 4) if rows[k]["E_avail_run"] else None
            for k in ("aware", "paper", "cold")
        },
        "util": round(aware["util"], 4),
        "util_paper": round(paper["util"], 4),
        "util_replay": round(rep["util"], 4),
        "samples_aware": aware["samples"],
        "samples_paper": paper["samples"],
        "samples_cold": rows["cold"]["samples"],
        "samples_replay": round(rep["samples"]),
        "preemptions_aware": aware["preempt"],
        "preemptions_paper": paper["preempt"],
        "decisions": len(decisions),
        "P1_in_run": {k: round(rows[k]["rate1"] or 0.0, 1) for k in runs},
        "other_cores": {
            "calibration": round(cal.others, 2),
            **{k: round(r.others, 2) for k, r in runs.items()},
        },
        "P_samples_per_s": {str(k): round(v, 1) for k, v in cal.rates.items()},
        "rescale_s": round(cal.rescale, 3),
        "fragment_startup_s": round(statistics.median(startup), 3) if startup else None,
        "window": {
            "node_offset": window.node_offset,
            "nodes": window.nodes,
            "trace_start": window.start_s,
            "trace_s": window.length_s,
            "time_scale": round(window.time_scale, 4),
            "changes": window.changes,
            "idle_node_s": round(idle, 1),
        },
        "leftover_processes": leftover,
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        sys.exit(rank_main(sys.argv[2:]))
    sys.exit(main())
