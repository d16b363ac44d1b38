"""Hole coverage and main-queue cost of ``SlurmBackfillProvider`` against Parsl's ``SlurmProvider``,
on a real loopback Slurm cluster (``scripts/slurm-loopback.sh``: 8 nodes, GraceTime 10 s).

Three runs replay the SAME main-partition workload, each on a freshly idle cluster:

* ``none``: the main workload alone (the baseline start time of every main job);
* ``backfill``: plus ``SlurmBackfillProvider`` (1-4 nodes, 1-10 min pilots of ``sleep 100000``),
  sized by us (``sizing="provider"``: a fixed size and walltime from the holes);
* ``scheduler``: the same provider with ``sizing="scheduler"``: Slurm sizes each pilot
  (``--nodes=1-4 --time-min=1 --time=10``, queued at once);
* ``hybrid``: ``sizing="hybrid"``: our walltime, Slurm may start it on fewer of our nodes;
* ``stock``: plus Parsl's ``SlurmProvider`` (2-node, 10-min blocks) on the same partition.

A loop stands in for Parsl's scaling strategy: every second it calls ``status()`` and
``submit()``s a new pilot whenever fewer than ``--pilots`` (4) are pending or running.

The main workload is a seeded SYNTHETIC one. The shipped trace (``bftrainer-dev``) records node
idle/busy states of a 4,734-node machine, not jobs: no job sizes, requested walltimes or queue,
and its idle intervals last 70 s to hours, so 8 of its nodes squeezed into 5 minutes would
need a ~100x time compression that leaves holes shorter than Slurm's scheduling cycle. The
synthetic workload keeps what makes backfill holes: long wide jobs (one per 150 s, half the
machine or more, 2-4 min requested), one full-machine job mid-way (the scheduler drains nodes
for it: holes with a planned end) and short 1-3-node jobs (1-3 min requested) at random times
in between, until the node-seconds reach ``--load`` (0.8) x the machine over ``--duration``
(the queue drains after that: about 35 % of the node-seconds are left idle). Every job runs
for 20-80 % of its requested time (whole minutes), as on real machines. Jobs are
``sbatch -p main -N n --time=T --wrap "sleep r"`` at their submit times.

Metrics, from ``squeue`` polled every second and Slurm's own time stamps (``scontrol show job``):

* hole node-seconds offered: the integral of the nodes not running a main job (in that run);
  covered: of the nodes running a pilot; ``hole_coverage = covered / offered`` over the run,
  from the first submission to the end of the last main job;
* pilot start: from a node becoming free of main jobs (or the run's start) to a pilot running
  on it, over the holes that got one (the others are counted);
* main delay: per main job, its StartTime in this run minus in the ``none`` run (both from
  the run's start); Slurm's scheduling cycles alone move starts by a few seconds either way;
* preemptions: pilots with a PreemptTime that are not requeued, plus requeues (Restarts);
* commands per hour: the Slurm commands the provider ran that reach the controller (``sbatch``,
  ``squeue``, ``sinfo``, ``scontrol show job``, ``scancel``; not ``scontrol show hostnames``),
  per hour of the run.

The sizing the rule picks (the most hole coverage whose main-job delay p95 is no more than
``provider``'s) is printed, and is ``best_sizing`` in the JSON line.

Needs root (the Slurm daemons). The cluster (``/tmp/bench-provider-slurm``, ports 18817 and
28001-28008) is the tests' (``tests.integration.slurm.loopback_cluster``), started here and
stopped at the end, on errors and Ctrl-C too. Progress and every pilot's life go to stderr;
stdout has the workload, each main job's start per run, the table, and one JSON line last.
``--quick``: a smoke run of the same code (about 70 s here, at most 90): 5 s of submissions
at a twentieth of the run times, the same 6 jobs as 20 s at a fifth but a quarter as long (a
run lasts as long as its longest chain of jobs, here a 3-minute short job and the full-machine
job waiting for its node, whatever ``--duration``); the requests stay whole minutes, so every
job ends long before its walltime. Its holes last seconds, under Slurm's scheduling cycle (5 s)
and the grace time (10 s): its figures only show that the code runs. It runs
``none,backfill,scheduler`` only: ``none`` for the delays, ``backfill`` for our sizing and
``best_sizing``'s bound, ``scheduler`` for Slurm's. ``hybrid`` is left out: its request is
``backfill``'s (ours, from the holes) with a node range as ``scheduler``'s, both run here, and
the rule joining them is pure (``tests/unit/test_sizing.py``); ``stock`` is Parsl's provider,
not ours. A quick run does not wait for an idle cluster at its end: the next run's start (or
the cluster's ``down``) does, once. The default takes about 35 minutes;
``--runs ...,control`` adds the workload alone again: the noise floor.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.integration.slurm, as `python benchmarks/provider.py`
from _hosts import sigterm_as_interrupt  # noqa: E402  (benchmarks/, beside this script)

from parsl_bf.providers.slurm.commands import epoch  # noqa: E402
from tests.integration import slurm  # noqa: E402

CLUSTER_DIR = "/tmp/bench-provider-slurm"
GRACE_S = 10
PILOT_COMMAND = "sleep 100000"  # holds its nodes until preempted or its walltime ends
RUNS = ("none", "backfill", "scheduler", "hybrid", "stock")
CHOICES = (*RUNS, "control")  # control: the main workload alone again (the noise floor)
PILOTED = ("backfill", "scheduler", "hybrid", "stock")
#: Our provider's runs and the ``sizing`` of each.
SIZING = {"backfill": "provider", "scheduler": "scheduler", "hybrid": "hybrid"}
_ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "DEADLINE"}
_ENDED |= {"OUT_OF_MEMORY", "BOOT_FAIL"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- the main workload ---------------------------------------------------------------------


@dataclass(frozen=True)
class MainJob:
    index: int
    submit_s: float  # from the run's start
    nodes: int
    request_min: int
    runtime_s: int
    kind: str


def make_workload(
    nodes: int, duration: float, seed: int, load: float = 0.8, pace: float = 1.0
) -> list[MainJob]:
    """Seeded main jobs: long wide ones, a full-machine one mid-way, short ones in between,
    ``load`` x the machine's node-seconds over ``duration`` in all. ``pace`` < 1 shortens
    every run time by that factor (the requests stay whole minutes): the quick mode's jobs end
    long before their walltime, so nothing but the workload's length changes."""
    rng = random.Random(seed)
    spec: list[tuple[float, int, int, int, str]] = []

    def runtime(request_min: int, low: float, high: float) -> int:
        return max(round(10 * pace), round(request_min * 60 * rng.uniform(low, high) * pace))

    n_long = max(1, round(duration / 150))
    for k in range(n_long):
        submit = duration * (k + rng.uniform(0.0, 0.6)) / n_long
        req = rng.randint(2, 4)
        width = rng.randint(math.ceil(nodes / 2), nodes - 2)
        spec.append((submit, width, req, runtime(req, 0.35, 0.7), "long"))
    spec.append((duration * rng.uniform(0.4, 0.6), nodes, 2, runtime(2, 0.3, 0.5), "full"))
    budget = load * nodes * duration - sum(n * r for _, n, _, r, _ in spec)
    sizes = list(range(1, min(3, nodes // 2) + 1))
    weights = [0.6, 0.3, 0.1][: len(sizes)]
    short: list[tuple[int, int, int]] = []
    while budget > 0 or len(short) < 4:
        req = rng.choices([1, 2, 3], [0.5, 0.35, 0.15])[0]
        n, r = rng.choices(sizes, weights)[0], runtime(req, 0.2, 0.8)
        short.append((n, req, r))
        budget -= n * r
    times = sorted(rng.uniform(0, 0.9 * duration) for _ in short)
    times[0] = 0.0  # the workload starts at once
    spec += [(t, n, q, r, "short") for t, (n, q, r) in zip(times, short, strict=True)]
    spec.sort(key=lambda s: s[0])
    return [MainJob(i, round(s[0], 1), s[1], s[2], s[3], s[4]) for i, s in enumerate(spec)]


# --- recording a run -----------------------------------------------------------------------


@dataclass
class Sample:
    t: float  # from the run's start
    main: frozenset[str]
    pilot: frozenset[str]
    main_running: int
    main_pending: int


@dataclass
class JobRecord:
    fields: dict[str, str]
    first_submit: str
    restarts: int = 0
    #: StartTime → NodeList of each time it ran (a COMPLETING job lists only the nodes not
    #: done yet; a requeued job runs again)
    ran: dict[str, str] = field(default_factory=dict)


class Recorder(threading.Thread):
    """Polls ``squeue`` every second (which nodes run main jobs, which pilots) and
    ``scontrol show job`` every other second (Slurm's time stamps, before MinJobAge)."""

    def __init__(self, env: dict[str, str], t0: float, ignore: set[str]) -> None:
        super().__init__(daemon=True)
        self.env, self.t0, self.ignore = env, t0, ignore
        self.hosts: dict[str, list[str]] = {}  # Slurm host list → its nodes
        self.samples: list[Sample] = []
        self.records: dict[str, JobRecord] = {}
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.error: BaseException | None = None

    def poll_queue(self) -> None:
        now = time.time()
        out = slurm.run(self.env, "squeue", "-h", "-o", "%i|%P|%T|%N", check=False)
        main: set[str] = set()
        pilot: set[str] = set()
        running = pending = 0
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 4 or parts[0] in self.ignore:
                continue
            _, partition, state, nodelist = parts
            if nodelist not in self.hosts:
                self.hosts[nodelist] = slurm.hostnames(self.env, nodelist) if nodelist else []
            hosts = self.hosts[nodelist]
            if partition == "main":
                if state in ("RUNNING", "COMPLETING", "CONFIGURING"):
                    main.update(hosts)
                    running += state == "RUNNING"
                elif state == "PENDING":
                    pending += 1
            elif state == "RUNNING":
                pilot.update(hosts)
        with self.lock:
            self.samples.append(
                Sample(now - self.t0, frozenset(main), frozenset(pilot), running, pending)
            )

    def poll_jobs(self) -> None:
        jobs = slurm.jobs(self.env)
        with self.lock:
            for job_id, fields in jobs.items():
                if job_id in self.ignore:
                    continue
                rec = self.records.get(job_id)
                if rec is None:  # a requeue resets SubmitTime: keep the first
                    rec = self.records[job_id] = JobRecord(fields, fields.get("SubmitTime", ""))
                rec.fields = fields
                rec.restarts = max(rec.restarts, int(fields.get("Restarts", "0") or 0))
                if fields.get("JobState") == "RUNNING":
                    rec.ran[fields.get("StartTime", "")] = fields.get("NodeList", "")

    def run(self) -> None:
        k = 0
        try:
            while not self.stop.is_set():
                tick = time.monotonic()
                self.poll_queue()
                if k % 2 == 0:
                    self.poll_jobs()
                k += 1
                self.stop.wait(max(0.0, 1.0 - (time.monotonic() - tick)))
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def snapshot(self) -> tuple[Sample | None, dict[str, JobRecord]]:
        with self.lock:
            return (self.samples[-1] if self.samples else None), dict(self.records)


class Submitter(threading.Thread):
    """Submits the main jobs at their submit times."""

    def __init__(self, env: dict[str, str], t0: float, workload: list[MainJob]) -> None:
        super().__init__(daemon=True)
        self.env, self.t0, self.workload = env, t0, workload
        self.ids: dict[int, str] = {}
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for job in self.workload:
                if self.stop.wait(max(0.0, self.t0 + job.submit_s - time.time())):
                    return
                self.ids[job.index] = slurm.sbatch(
                    self.env,
                    "main",
                    job.nodes,
                    f"sleep {job.runtime_s}",
                    f"--time={job.request_min}",
                    f"--job-name=main.{job.index}",
                )
        except BaseException as exc:
            self.error = exc

    @property
    def done(self) -> bool:
        return len(self.ids) == len(self.workload)


# --- the pilots ----------------------------------------------------------------------------


def make_provider(kind: str, script_dir: Path):
    from parsl.launchers import SimpleLauncher

    if kind in SIZING:
        from parsl_bf.providers import SlurmBackfillProvider

        provider = SlurmBackfillProvider(
            partition="backfill",
            min_nodes=1,
            max_nodes=4,
            min_walltime="00:01:00",
            max_walltime="00:10:00",
            sizing=SIZING[kind],
            launcher=SimpleLauncher(),
            status_polling_interval=1,
        )
    else:
        from parsl.providers import SlurmProvider

        provider = SlurmProvider(
            partition="backfill",
            nodes_per_block=2,
            walltime="00:10:00",
            launcher=SimpleLauncher(),
            init_blocks=0,
            max_blocks=4,
            cmd_timeout=30,
        )
    script_dir.mkdir(parents=True, exist_ok=True)
    provider.script_dir = str(script_dir)
    return provider


def count_commands(provider, counts: dict[str, int]) -> None:
    """Count, in ``counts``, the Slurm commands ``provider`` runs that reach the controller."""

    def counted(words: list[str]) -> None:
        if words[:3] != ["scontrol", "show", "hostnames"]:  # parsed locally
            key = " ".join(words[:3]) if words[:1] == ["scontrol"] else words[0]
            counts[key] = counts.get(key, 0) + 1

    if hasattr(provider, "_run"):  # ours: every command goes through _run(args)
        run = provider._run

        def ours(args):
            counted(list(args))
            return run(args)

        provider._run = ours
    else:  # Parsl's: execute_wait(cmd) with a shell command line
        execute = provider.execute_wait

        def stock(cmd, *args, **kwargs):
            counted(cmd.split())
            return execute(cmd, *args, **kwargs)

        provider.execute_wait = stock


class Scaler:
    """Parsl's scaling in miniature: keep ``limit`` pilots pending or running."""

    def __init__(self, provider, limit: int) -> None:
        self.provider, self.limit = provider, limit
        self.ids: list[str] = []
        self.states: dict[str, object] = {}
        self.failures = 0

    def step(self) -> None:
        from parsl.jobs.states import JobState
        from parsl.providers.errors import SubmitException

        live = [i for i in self.ids if not getattr(self.states.get(i), "terminal", False)]
        if live:
            for job_id, status in zip(live, self.provider.status(live), strict=True):
                self.states[job_id] = status
        active = sum(
            1
            for i in self.ids
            if self.states[i].state in (JobState.PENDING, JobState.RUNNING, JobState.HELD)
        )
        for _ in range(self.limit - active):
            try:
                job_id = self.provider.submit(PILOT_COMMAND, 1)
            except SubmitException as exc:
                self.failures += 1
                log(f"  submit refused: {exc}")
                return
            self.ids.append(job_id)
            self.states[job_id] = self.provider.status([job_id])[0]

    def cancel(self) -> None:
        live = [i for i in self.ids if not getattr(self.states.get(i), "terminal", False)]
        if live:
            try:
                self.provider.cancel(live)
            except Exception as exc:  # the cluster is cleared anyway
                log(f"  cancel: {exc}")

    def waiting(self) -> tuple[int, int]:
        """Pilots not running: kept in the provider until a hole opens (ours only), and
        queued in Slurm."""
        from parsl.jobs.states import JobState

        pilots = getattr(self.provider, "pilots", {})
        pending = [i for i in self.ids if self.states[i].state is JobState.PENDING]
        held = sum(1 for i in pending if i in pilots and pilots[i].scheduler_id is None)
        return held, len(pending) - held

    def submitted(self) -> int:
        """Pilots that reached Slurm (sbatch calls)."""
        pilots = getattr(self.provider, "pilots", None)
        if pilots is None:
            return len(self.ids)
        return sum(1 for p in pilots.values() if p.scheduler_id is not None)


# --- one run -------------------------------------------------------------------------------


@dataclass
class RunResult:
    kind: str
    samples: list[Sample]
    starts: dict[int, float]  # main job index → StartTime from the run's start
    end_s: float  # the last main job's end, from the run's start
    pilots_requested: int = 0
    pilots_submitted: int = 0
    preemptions: int = 0
    commands: dict[str, int] = field(default_factory=dict)
    pilot_reasons: dict[str, int] = field(default_factory=dict)


def run_once(kind: str, env: dict[str, str], workload: list[MainJob], args, work: Path):
    """One run on a freshly idle cluster: the workload (and pilots), until its last job ends."""
    slurm.quiesce(env, args.nodes, settle_s=3)
    ignore = set(slurm.jobs(env))
    scaler = Scaler(make_provider(kind, work / kind), args.pilots) if kind in PILOTED else None
    commands: dict[str, int] = {}
    if scaler is not None:
        count_commands(scaler.provider, commands)
    t0 = time.time()
    recorder = Recorder(env, t0, ignore)
    submitter = Submitter(env, t0, workload)
    recorder.start()
    submitter.start()
    log(f"[{kind}] started: {len(workload)} main jobs over {args.duration:.0f} s")
    limit = t0 + args.duration + 900
    last_progress = 0.0
    try:
        while True:
            tick = time.monotonic()
            for thread in (recorder, submitter):
                if thread.error is not None:
                    raise RuntimeError(f"{kind}: {thread.error!r}") from thread.error
            if scaler is not None:
                scaler.step()
            sample, records = recorder.snapshot()
            main_ids = set(submitter.ids.values())
            ended = [
                i
                for i in main_ids
                if records.get(i, JobRecord({}, "")).fields.get("JobState") in _ENDED
            ]
            now = time.time() - t0
            if sample is not None and now - last_progress >= args.progress:
                last_progress = now
                line = (
                    f"[{kind}] t={now:.0f}s main running {sample.main_running} "
                    f"({len(sample.main)} nodes), pending {sample.main_pending}, "
                    f"done {len(ended)}/{len(workload)}"
                )
                if scaler is not None:
                    held, queued = scaler.waiting()
                    line += (
                        f"; pilots running on {len(sample.pilot)} nodes, waiting in provider "
                        f"{held}, queued in Slurm {queued}, sbatch'd {scaler.submitted()}"
                    )
                log(line)
            if submitter.done and len(ended) == len(workload):
                break
            if time.time() > limit:
                raise RuntimeError(f"{kind}: the main workload did not finish in time")
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        time.sleep(1.5)  # a last poll of both kinds after the end
    finally:
        submitter.stop.set()
        if scaler is not None:
            scaler.cancel()
        recorder.stop.set()
        recorder.join(timeout=30)
        submitter.join(timeout=30)
    recorder.poll_jobs()
    records = recorder.records
    starts, ends = {}, []
    for index, job_id in submitter.ids.items():
        fields = records[job_id].fields
        start, end = epoch(fields.get("StartTime", "")), epoch(fields.get("EndTime", ""))
        if start is not None:
            starts[index] = start - t0
        if end is not None:
            ends.append(end - t0)
    main_ids = set(submitter.ids.values())
    preemptions = 0
    for job_id, rec in records.items():
        if job_id in main_ids:
            continue
        preempted = rec.fields.get("PreemptTime", "None") not in ("None", "", "Unknown")
        preemptions += rec.restarts + (preempted and rec.fields.get("Requeue") == "0")
    result = RunResult(kind, recorder.samples, starts, max(ends))
    if scaler is not None:
        result.pilots_requested = len(scaler.ids)
        result.pilots_submitted = scaler.submitted()
        result.preemptions = preemptions
        result.commands = commands
        for pilot in getattr(scaler.provider, "pilots", {}).values():
            reason = pilot.reason or pilot.state.name.lower()
            result.pilot_reasons[reason] = result.pilot_reasons.get(reason, 0) + 1
    if not args.quick:  # --quick: the next run's start (or `down`) waits for idle, once
        slurm.quiesce(env, args.nodes, settle_s=3)
    log(f"[{kind}] done: last main job ended at t={result.end_s:.0f}s")
    if scaler is not None:
        log_pilots(kind, scaler, records, main_ids, t0)
    return result


def log_pilots(kind: str, scaler: Scaler, records: dict[str, JobRecord], main_ids, t0) -> None:
    """Every pilot's life, from Slurm's time stamps (and the hole ours was sized to)."""
    asked = {}
    for job in getattr(scaler.provider, "_jobs", {}).values():
        if job.pilot.scheduler_id and job.request is not None:
            asked[job.pilot.scheduler_id] = job.request

    def rel(stamp: str) -> str:
        when = epoch(stamp)
        return "-" if when is None else f"{when - t0:.0f}"

    for job_id, rec in sorted(records.items(), key=lambda kv: int(kv[0])):
        if job_id in main_ids:
            continue
        f = rec.fields
        line = (
            f"[{kind}] pilot {job_id}: submitted t={rel(rec.first_submit)} "
            f"--time {f.get('TimeLimit', '?')}"
        )
        if job_id in asked:
            request = asked[job_id]
            if request.sized_to_hole:
                line += f" (hole: {','.join(request.hosts)} for {request.walltime_s:.0f} s)"
            else:
                line += " (sized by Slurm)"
        for start, hosts in rec.ran.items():
            line += f", ran from t={rel(start)} on {hosts}"
        if f.get("JobState") not in ("RUNNING", "PENDING"):
            line += f", ended t={rel(f.get('EndTime', ''))}"
        line += f", {f.get('JobState')}"
        if f.get("PreemptTime", "None") not in ("None", ""):
            line += f", preempted t={rel(f['PreemptTime'])}"
        if rec.restarts:
            line += f", requeued {rec.restarts}x"
        log(line)


# --- figures -------------------------------------------------------------------------------


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def coverage(result: RunResult, nodes: list[str]) -> dict:
    """Offered and covered node-seconds, and hole-opening → pilot-running latencies.

    A hole opens on a node when it is first seen free of main jobs (every node at the start)
    and closes when a main job is seen on it; a change is dated midway between the poll that
    saw it and the one before. A hole's latency is from its opening to a pilot running there.
    """
    offered = covered = 0.0
    samples = [s for s in result.samples if s.t <= result.end_s]
    for a, b in zip(samples, samples[1:] + [None], strict=True):
        t_next = result.end_s if b is None else b.t
        dt = max(0.0, t_next - max(a.t, 0.0))
        offered += dt * sum(1 for n in nodes if n not in a.main)
        covered += dt * len(a.pilot - a.main)
    opened: dict[str, float | None] = dict.fromkeys(nodes, 0.0)  # all free at the start
    got_pilot: set[str] = set()
    waits: list[float] = []
    holes: list[tuple[float, bool]] = []  # (length, got a pilot)
    previous_t = 0.0
    for s in samples:
        at = (previous_t + s.t) / 2
        for n in nodes:
            if n in s.main:
                if opened[n] is not None:
                    holes.append((at - opened[n], n in got_pilot))
                opened[n] = None
                got_pilot.discard(n)
                continue
            if opened[n] is None:
                opened[n] = at
            if n in s.pilot and n not in got_pilot:
                waits.append(max(0.0, at - opened[n]))
                got_pilot.add(n)
        previous_t = s.t
    for n in nodes:
        if opened[n] is not None:
            holes.append((result.end_s - opened[n], n in got_pilot))
    long_holes = [got for length, got in holes if length >= 60]
    return {
        "offered": offered,
        "covered": covered,
        "coverage": covered / offered if offered else None,
        "waits": waits,
        "holes": len(holes),
        "covered_holes": sum(got for _, got in holes),
        "long_holes": len(long_holes),
        "covered_long_holes": sum(long_holes),
    }


def fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def rounded(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def best_sizing(figures: dict[str, dict]) -> str | None:
    """The sizing that covers the most of the holes with a main-job delay p95 no more than
    ``provider``'s (plus a second: Slurm's cycles move starts by that much); None without
    ``provider``'s run."""
    ours = figures.get("backfill")
    if ours is None or ours["coverage"] is None:
        return None
    bound = (ours["delay_p95"] or 0.0) + 1.0
    fits = [
        (figures[kind]["coverage"] or 0.0, kind == "backfill", SIZING[kind])
        for kind in SIZING
        if kind in figures and (figures[kind]["delay_p95"] or 0.0) <= bound
    ]
    return max(fits)[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=8, help="nodes of the cluster (default 8)")
    ap.add_argument(
        "--duration", type=float, default=300, help="seconds of main-job submissions (300)"
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 5 s workload at 1/20 of the run times, runs none,backfill,scheduler",
    )
    ap.add_argument(
        "--load", type=float, default=0.8, help="main node-seconds / (nodes x duration) (0.8)"
    )
    ap.add_argument("--pilots", type=int, default=4, help="pilots kept requested (default 4)")
    ap.add_argument(
        "--runs",
        default=",".join(RUNS),
        help="runs, comma-separated, in order (default none,backfill,scheduler,hybrid,stock; "
        "control: the main workload alone again, its delays are the noise floor)",
    )
    ap.add_argument("--progress", type=float, default=15, help="seconds between progress lines")
    args = ap.parse_args()
    pace = 1.0
    if args.quick:
        # Under 90 s in all (20 s at a fifth took 141 s). A run lasts as long as its longest
        # chain of jobs (a 3-minute short job, then the full-machine job waiting for its
        # node), whatever --duration: a twentieth of the run times cuts it from 29 s to 7 s,
        # and 5 s of submissions keep the same 6 jobs (a longer --duration at that pace adds
        # short ones to reach --load). Why not hybrid and stock: the docstring.
        args.duration, pace = 5.0, 0.05
        if args.runs == ",".join(RUNS):
            args.runs = "none,backfill,scheduler"
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    if any(r not in CHOICES for r in runs) or not runs or len(set(runs)) < len(runs):
        ap.error(f"--runs: some of {', '.join(CHOICES)}, each once")
    if args.nodes < 4:
        ap.error("--nodes: at least 4")
    if why := slurm.unavailable():
        print(f"error: this benchmark starts a loopback Slurm cluster: {why}", file=sys.stderr)
        return 2

    workload = make_workload(args.nodes, args.duration, args.seed, args.load, pace)
    work_s = sum(j.nodes * j.runtime_s for j in workload)
    print(
        f"main workload (synthetic, seed {args.seed}): {len(workload)} jobs over "
        f"{args.duration:.0f} s, {work_s} node-s ({work_s / (args.nodes * args.duration):.2f} "
        f"of {args.nodes} nodes x {args.duration:.0f} s); grace time {GRACE_S} s"
    )
    print(f"{'job':>4} {'submit s':>8} {'nodes':>5} {'--time':>6} {'runs s':>6}  kind")
    for j in workload:
        print(
            f"{j.index:>4} {j.submit_s:>8.1f} {j.nodes:>5} {j.request_min:>4}mn "
            f"{j.runtime_s:>6}  {j.kind}"
        )
    sys.stdout.flush()

    sigterm_as_interrupt()
    work = Path(tempfile.mkdtemp(prefix="bench-provider-"))
    results: dict[str, RunResult] = {}
    ports = {"ctld_port": 18817, "base_port": 28000}  # apart from the tests' and `make slurm-up`
    try:
        with slurm.loopback_cluster(CLUSTER_DIR, args.nodes, grace_s=GRACE_S, **ports) as env:
            os.environ["SLURM_CONF"] = env["SLURM_CONF"]  # for the providers' commands
            os.chdir(work)  # the pilots' working directory
            for kind in runs:
                results[kind] = run_once(kind, env, workload, args, work)
    except KeyboardInterrupt:
        log("interrupted: every job cancelled and the cluster stopped")
        return 130
    finally:
        os.chdir(ROOT)
        shutil.rmtree(work, ignore_errors=True)

    nodes = [f"n{i}" for i in range(1, args.nodes + 1)]
    base = results.get("none")
    figures: dict[str, dict] = {}
    for kind, res in results.items():
        cov = coverage(res, nodes)
        delays = []
        if base is not None:
            delays = [res.starts[i] - base.starts[i] for i in res.starts if i in base.starts]
        figures[kind] = {
            **cov,
            "delay_p50": median(delays) if kind != "none" else None,
            "delay_p95": pct(delays, 0.95) if kind != "none" else None,
            "delayed": sum(1 for d in delays if d > GRACE_S + 2),
            "wait_p50": median(cov["waits"]) if kind in PILOTED else None,
            "wait_p95": pct(cov["waits"], 0.95) if kind in PILOTED else None,
            "commands_per_h": (
                sum(res.commands.values()) * 3600 / res.end_s if kind in PILOTED else None
            ),
        }

    print("\nmain job start times, s from the run's start (the other runs: minus in none)")
    print(f"{'job':>4} {'nodes':>5} {'submit':>7} " + " ".join(f"{k:>9}" for k in results))
    for j in workload:
        cells = []
        for kind, res in results.items():
            start = res.starts.get(j.index)
            if start is None:
                cells.append("-")
            elif kind == "none" or base is None or j.index not in base.starts:
                cells.append(f"{start:.0f}")
            else:
                cells.append(f"{start - base.starts[j.index]:+.0f}")
        print(f"{j.index:>4} {j.nodes:>5} {j.submit_s:>7.0f} " + " ".join(f"{c:>9}" for c in cells))

    print()
    print(
        f"{'run':>9} {'offered':>8} {'covered':>8} {'coverage':>8} {'pilot start s':>13} "
        f"{'main delay s':>12} {'delayed':>7} {'pilots':>7} {'preempt':>7} {'commands':>8}"
    )
    print(
        f"{'':>9} {'node-s':>8} {'node-s':>8} {'':>8} {'p50 / p95':>13} {'p50 / p95':>12} "
        f"{f'>{GRACE_S + 2}s':>7} {'sbatch':>7} {'':>7} {'per h':>8}"
    )
    for kind, res in results.items():
        f = figures[kind]
        cells = ["-"] * 8
        if kind != "none":  # control: the noise floor of the start times
            cells[3] = f"{fmt(f['delay_p50'])} / {fmt(f['delay_p95'])}"
            cells[4] = str(f["delayed"])
        if kind in PILOTED:
            cells = [
                f"{f['covered']:.0f}",
                fmt(f["coverage"], 3),
                f"{fmt(f['wait_p50'])} / {fmt(f['wait_p95'])}",
                f"{fmt(f['delay_p50'])} / {fmt(f['delay_p95'])}",
                str(f["delayed"]),
                str(res.pilots_submitted),
                str(res.preemptions),
                fmt(f["commands_per_h"], 0),
            ]
        print(
            f"{kind:>9} {f['offered']:>8.0f} {cells[0]:>8} {cells[1]:>8} {cells[2]:>13} "
            f"{cells[3]:>12} {cells[4]:>7} {cells[5]:>7} {cells[6]:>7} {cells[7]:>8}"
        )
    for kind, res in results.items():
        if kind not in PILOTED:
            continue
        f = figures[kind]
        print(
            f"{kind}: {f['covered_holes']} of {f['holes']} holes got a pilot "
            f"({f['covered_long_holes']} of the {f['long_holes']} lasting >= 60 s); "
            f"{res.pilots_requested} pilots asked for, {res.pilots_submitted} sbatch'd"
            + (f"; ends: {res.pilot_reasons}" if res.pilot_reasons else "")
            + f"; commands: {res.commands}"
        )
    best = best_sizing(figures)
    if best is not None:
        print(f"sizing with the most hole coverage and no more main delay (p95) than ours: {best}")
    ours, stock = figures.get("backfill", {}), figures.get("stock", {})
    out = {
        "hole_coverage": rounded(ours.get("coverage")),
        "pilot_start_p50_s": rounded(ours.get("wait_p50"), 1),
        "main_delay_p50_s": rounded(ours.get("delay_p50"), 1),
        "stock_hole_coverage": rounded(stock.get("coverage")),
        "pilot_start_p95_s": rounded(ours.get("wait_p95"), 1),
        "main_delay_p95_s": rounded(ours.get("delay_p95"), 1),
        "stock_pilot_start_p50_s": rounded(stock.get("wait_p50"), 1),
        "stock_main_delay_p50_s": rounded(stock.get("delay_p50"), 1),
        "stock_main_delay_p95_s": rounded(stock.get("delay_p95"), 1),
        "pilots_submitted": results["backfill"].pilots_submitted if "backfill" in results else None,
        "stock_pilots_submitted": results["stock"].pilots_submitted if "stock" in results else None,
        "preemptions": results["backfill"].preemptions if "backfill" in results else None,
        "stock_preemptions": results["stock"].preemptions if "stock" in results else None,
        "sizing": {
            SIZING[kind]: {
                "hole_coverage": rounded(figures[kind]["coverage"]),
                "pilot_start_p50_s": rounded(figures[kind]["wait_p50"], 1),
                "pilot_start_p95_s": rounded(figures[kind]["wait_p95"], 1),
                "main_delay_p50_s": rounded(figures[kind]["delay_p50"], 1),
                "main_delay_p95_s": rounded(figures[kind]["delay_p95"], 1),
                "commands_per_h": rounded(figures[kind]["commands_per_h"], 0),
                "pilots_submitted": results[kind].pilots_submitted,
                "preemptions": results[kind].preemptions,
            }
            for kind in SIZING
            if kind in figures
        },
        "best_sizing": best,
        "stock_commands_per_h": rounded(stock.get("commands_per_h"), 0),
        "grace_s": GRACE_S,
        **(
            {
                "control_main_delay_p50_s": rounded(figures["control"]["delay_p50"], 1),
                "control_main_delay_p95_s": rounded(figures["control"]["delay_p95"], 1),
            }
            if "control" in figures
            else {}
        ),
        "nodes": args.nodes,
        "duration_s": args.duration,
        "seed": args.seed,
        "main_jobs": len(workload),
        "workload": "synthetic",
        "load": args.load,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
