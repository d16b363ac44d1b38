"""Rescale cost of a ResNet-18 fragment on CPU: from the decision to the first step at the new
size, for a shrink (BIG → SMALL ranks) and a grow (SMALL → BIG), median of ``--repeats`` each.

At the decision the old ranks get SIGUSR1: they finish their step, rank 0 writes the checkpoint
and the result file, they exit. The new size runs with ``--after`` that result file: it imports
torch and builds the model and optimizer, waits for the file, loads the checkpoint and steps.
Modes (``--mode``, a comma-separated list; by default all five, in one run, ``ranks-fork`` first:
the JSON line's ``start_s``, ``restart_s``, ``shrink_s``, ``grow_s``, ``shrink_handover_s``,
``grow_handover_s`` and ``step_s`` are the first mode's):

- ``standby``: one ``mpiexec -n N`` of the new size started before the decision, waiting until
  it reports ``--ready``, as a pilot's warm workers on their nodes would be;
- ``cold``: that ``mpiexec -n N`` started at the decision, so process start-up (imports:
  ~2.4 CPU-s per rank here) is inside the interval;
- ``ranks``: warm ranks (:mod:`parsl_bf.pilot.ranks`): a ``RankPool`` whose standbys are
  ready before the decision (a pilot that has been up a while), each rank of a launch its own
  standby and rendezvous group, as the executor launches them. Six cases: ``start`` (a
  fragment from zero nodes, no checkpoint), ``restart`` (after a preemption: the old fragment
  got SIGTERM, checkpointed and exited; the decision is the relaunch at the same size),
  ``shrink_handover`` and ``grow_handover`` (the warm hand-over: at the decision the new size
  is launched with ``--after``/``--ready``, and the old one gets SIGUSR1 once the new one is
  ready), ``shrink`` and ``grow`` (in place, :mod:`parsl_bf.training.resize`, with a rank per
  node as here: a shrink's decision writes the request, the kept ranks take their next step at
  the new size in the same processes and the others leave; a grow's decision launches the
  joiner ranks, and once they are set up writes the request, and the joiners connect and get
  the state from rank 0). Besides the decision → first step it reports the step time at the
  new size (from the ``step`` reports) and the overhead, the difference, against the target of
  0.5 s;
- ``ranks-fork`` (the default, first): the same cases on a ``RankPool(fork=True)``, as the
  agent keeps on a CPU node: relays ready before the decision, and each rank forked from the
  pool's rank host, which has imported torch and the trainer once;
- ``ranks-cold``: the same four cases with no pool: each rank a cold ``mpiexec -n 1`` started
  at the decision (what a launch gets when no standby is ready), the baseline of ``ranks``.

- ``executor``: the same rescales decided by the controller, through the executor, the
  channel, the agent and the ranks: a ``BackfillExecutor`` on a ``LocalBackfillProvider`` of 2
  emulated nodes whose idle and busy spells alternate (a synthetic cycle, 30 s idle and 5 s
  busy per node, half a period apart: both idle about 25 s of each 35), one task of the same
  model (1-2 nodes), for ``--executor-s`` seconds twice: in place (the defaults) and by hand-over
  (``allocator={"grow_in_place": False, "shrink_in_place": False}``). Seconds from each
  decision's command (its event) to the first step at the new size
  (:func:`parsl_bf.executor.analysis.rescale_times`), beside ``ranks-fork``'s direct
  figures.

``--quick`` (under 90 s): one cycle of ``ranks-fork``, ``ranks-cold``, ``standby`` and the
executor in place for 20 s.

A figure that cannot be right (a first step before the decision, an overhead below zero beyond
the noise, a load before the old ranks stopped) is printed as SUSPECT and left out of the
medians. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from parsl_bf.environment import THREADS_PER_RANK  # noqa: E402
from parsl_bf.pilot.agent import _output  # noqa: E402
from parsl_bf.pilot.ranks import RankGroup, RankPool, launch_ranks  # noqa: E402
from parsl_bf.training.command import MPIEXEC, mpiexec_argv, worker_argv  # noqa: E402
from parsl_bf.training.handover import MODES  # noqa: E402
from parsl_bf.training.resize import GrowRequest, ShrinkRequest, ready_file  # noqa: E402
from tests.integration.fragments import rank_pids  # noqa: E402

TASK = "parsl_bf.training.examples:resnet18_synthetic"
GLOBAL_BATCH = 16  # samples per step at every world size
OPTIONS = {"samples": 128, "image": 64, "global_batch": GLOBAL_BATCH}
HANDOVER_MODES = ("standby", "cold")
RANKS_MODES = ("ranks-fork", "ranks", "ranks-cold")
CASES = ("start", "restart", "shrink_handover", "grow_handover", "shrink", "grow")
TARGET_OVERHEAD_S = 0.5  # the target: decision → first step ≤ 0.5 s + one step
#: An overhead below -NOISE (or -10 % of a step) cannot be: the first step is a step.
NOISE_S = 0.05
TIMEOUT_S = 300.0
#: Paths in the command lines of every process this run starts (its temporary directories, its
#: pool's socket), to find leftovers at the end: not another program's standbys.
MARKS: list[str] = []
#: How a warm successor takes the state (the worker's --handover), from --handover.
HANDOVER = ["auto"]


#: The default: every mode. ``--quick``'s: one mode of each function (see main).
MODES_ALL = ("ranks-fork", "ranks", "ranks-cold", "standby", "cold", "executor")
MODES_QUICK = ("ranks-fork", "ranks-cold", "standby", "executor")


def launch(world: int, tmp: Path, run: int, env: dict[str, str]) -> subprocess.Popen:
    """Run ``run`` of the fragment; from run 1 on it takes over from run - 1 (``--after``)."""
    args = mpiexec_argv(world) + worker_argv(
        TASK,
        10**9,
        tmp / "ckpt",
        OPTIONS,
        checkpoint_every=1000,
        report=tmp / "report.jsonl",
        result=tmp / f"result-{run}.json",
    )
    if run > 0:
        args += [
            "--after",
            str(tmp / f"result-{run - 1}.json"),
            "--ready",
            str(tmp / f"ready-{run}"),
        ]
    log = (tmp / f"run-{run}.log").open("w")  # a file, not a pipe that nobody drains
    return subprocess.Popen(
        args,
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def reports(path: Path) -> list[dict]:
    """Complete report lines of ``path`` (a directory: its ``report.jsonl``)."""
    if path.is_dir():
        path = path / "report.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().split("\n")[:-1]  # a line being written waits for the next look
    return [json.loads(x) for x in lines if x]


def starts(tmp: Path) -> list[dict]:
    return [r for r in reports(tmp) if r["event"] == "start"]


def wait_until(
    pred: Callable[[], object],
    timeout: float = TIMEOUT_S,
    poll: float = 0.05,
    check: Callable[[], None] | None = None,
) -> None:
    """Until ``pred()``; ``check()`` raises if what is waited for cannot come any more."""
    deadline = time.monotonic() + timeout
    while not pred():
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise TimeoutError("fragment did not report in time")
        time.sleep(poll)


def handover(
    mode: str, repeats: int, big: int, small: int, env: dict[str, str], suspect: list[str]
) -> dict:
    """``standby`` or ``cold``: alternately shrink big → small and grow back, ``repeats`` each;
    the seconds of each, by kind."""
    timings: dict[str, list[float]] = {"shrink": [], "grow": []}
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="rescale-") as d:
        tmp = Path(d)
        MARKS.append(d)
        world = big
        proc = launch(world, tmp, 0, env)
        procs.append(proc)

        def alive(p: subprocess.Popen, run: int) -> Callable[[], None]:
            """A check for wait_until: a run that exited cannot report any more."""

            def check() -> None:
                if p.poll() is not None:
                    print((tmp / f"run-{run}.log").read_text(), file=sys.stderr)
                    raise RuntimeError(f"{mode}: run {run} exited {p.returncode}")

            return check

        try:
            for run in range(2 * repeats):
                # The current run must be training (its first step done) before the decision.
                wait_until(lambda run=run: len(starts(tmp)) > run, check=alive(proc, run))
                pids = rank_pids(proc, world)
                new = small if world == big else big
                if mode == "standby":  # the next size waits, set up, before the decision
                    following = launch(new, tmp, run + 1, env)
                    procs.append(following)
                    try:
                        wait_until(
                            lambda run=run: (tmp / f"ready-{run + 1}").exists(),
                            check=alive(following, run + 1),
                        )
                    except TimeoutError:
                        print((tmp / f"run-{run + 1}.log").read_text(), file=sys.stderr)
                        raise
                decided = time.time()
                if mode == "cold":
                    following = launch(new, tmp, run + 1, env)
                    procs.append(following)
                for pid in pids:
                    os.kill(pid, signal.SIGUSR1)
                if proc.wait(timeout=TIMEOUT_S) != 0:
                    print((tmp / f"run-{run}.log").read_text(), file=sys.stderr)
                    raise RuntimeError(f"{mode}: run {run} failed")
                proc = following
                wait_until(lambda run=run: len(starts(tmp)) > run + 1, check=alive(proc, run + 1))
                seconds = starts(tmp)[-1]["first_step_at"] - decided
                kind = "shrink" if new < world else "grow"
                row = f"{mode:>10} {kind:>8} {world:>4} {new:>3} {seconds:>8.2f}"
                if seconds < 0:  # the first step at the new size came before the decision
                    print(f"{row}  SUSPECT: first step before the decision")
                    suspect.append(f"{mode} {kind} #{run // 2}: first step before the decision")
                else:
                    timings[kind].append(seconds)
                    print(row)
                world = new
            for pid in rank_pids(proc, world):
                os.kill(pid, signal.SIGTERM)
            proc.wait(timeout=TIMEOUT_S)
        finally:
            for p in procs:  # whatever a failure left running
                if p.poll() is None:
                    p.kill()
                    p.wait()
    return {f"{k}_s": _median(v) for k, v in timings.items()}


# --- warm ranks -----------------------------------------------------------------------------


class Fragment:
    """One launch of the fragment's ranks (generation ``gen``) in ``tmp/gen-N``; ``joins``: the
    ``world`` joiners of a grow in place of that fragment (the rendezvous groups 1..world of
    world + 1 in its ``grow/``), each its own launch, reporting in its files."""

    def __init__(
        self,
        tmp: Path,
        gen: int,
        world: int,
        pool: RankPool | None,
        env: dict,
        after=None,
        joins: Fragment | None = None,
    ):
        self.dir, self.gen, self.world, self.env = tmp / f"gen-{gen}", gen, world, env
        self.dir.mkdir()
        files = joins.dir if joins is not None else self.dir
        flags = {
            "checkpoint_every": 1000,  # only the stop's checkpoint
            "report": files / "report.jsonl",
            "result": files / "result.json",
            "resize": files / "resize.json",
        }
        self.first, self.of = 0, world
        if joins is not None:
            flags["join"] = joins.dir / "grow"
            self.first, self.of = 1, world + 1
        elif world > 1:  # every rank its own rendezvous group, as the executor launches them
            flags["rendezvous"] = self.dir / "rendezvous"
        if after is not None:  # a warm successor of that fragment
            flags |= {"after": after.dir / "result.json", "ready": self.dir / "ready"}
            flags["handover"] = HANDOVER[0]
        self.argv = worker_argv(TASK, 10**9, tmp / "ckpt", OPTIONS, **flags)
        self.pool = pool
        self.group: RankGroup | None = None

    def launch(self) -> None:
        spec = {"first": self.first, "count": self.world, "of": self.of, "mpiexec": MPIEXEC}
        self.group = launch_ranks(
            f"gen-{self.gen}",
            spec,
            self.argv,
            self.env,
            str(ROOT),
            str(self.dir / "stdout"),
            str(self.dir / "stderr"),
            self.pool,
            socket.gethostname(),
            _output,
        )

    def check(self) -> None:
        """Raise if a rank failed (its fragment will never report)."""
        assert self.group is not None
        code = self.group.poll()
        if code not in (None, 0):
            err = self.dir / "stderr"
            print(err.read_text() if err.exists() else "", file=sys.stderr)
            raise RuntimeError(f"fragment gen-{self.gen} exited with {code}")

    def first_steps(self, event: str = "start") -> tuple[dict, dict]:
        """Its first ``event`` report (``start``, or ``shrunk``/``grown``: its first step at
        the new size) and the first ``step`` report after it."""
        found: dict[str, dict] = {}

        def seen() -> bool:
            # The step report must come after the event in the file: one from before it (a
            # fragment resized in place reports steps at its old size first) is no step of
            # the new size.
            lines = reports(self.dir)
            at = next((i for i, r in enumerate(lines) if r["event"] == event), None)
            if at is None:
                return False
            step = next((r for r in lines[at + 1 :] if r["event"] == "step"), None)
            if step is None:
                return False
            found[event], found["step"] = lines[at], step
            return True

        wait_until(seen, poll=0.01, check=self.check)
        return found[event], found["step"]

    def stop(self, sig: int) -> None:
        """``sig`` to its ranks; wait for them to checkpoint and exit."""
        assert self.group is not None
        self.group.signal(sig)
        wait_until(lambda: self.group.poll() is not None, poll=0.01)
        if self.group.returncode != 0:
            self.check()

    def kill(self) -> None:
        if self.group is not None and self.group.poll() is None:
            self.group.signal(signal.SIGKILL)
            for p in self.group.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=10)


def pool_ready(pool: RankPool | None) -> None:
    """Until every standby of the pool is ready (the pilot has been up a while), so that none
    warms up during a measurement. The benchmark refills the pool itself, at once and at
    niceness 0 (``fill()``), not as the agent does (``serve()``'s niced refill, 2 s after a
    take): what is measured is a launch onto ready standbys, not how fast they come back."""
    if pool is None:
        return
    pool.fill()

    forking = pool.host is not None

    def ready() -> bool:
        pool.serve()
        if pool.broken:
            raise RuntimeError("the standby ranks cannot start here")
        if forking and pool.host is None:
            raise RuntimeError("ranks cannot be forked here (the rank pool fell back)")
        if forking and not pool.host.ready:
            return False
        return sum(s.ready and s.job is None for s in pool.standbys.values()) >= pool.size

    wait_until(ready, poll=0.02)


def measure(
    case: str,
    new: Fragment,
    decided: float,
    old_size: int,
    ready_at: float | None = None,
    old: Fragment | None = None,
) -> dict:
    """One case's figures (seconds from the decision), from the new fragment's reports;
    ``old``, ``ready_at``: a hand-over's predecessor, and when the new ranks were ready."""
    start, step = new.first_steps()
    steps = (step["samples"] - start["samples"]) / GLOBAL_BATCH
    out = {
        "case": case,
        "from": old_size,
        "to": new.world,
        "decision_to_first_step_s": start["first_step_at"] - decided,
        "step_s": (step["t"] - start["first_step_at"]) / steps,
        "ready_s": None if ready_at is None else ready_at - decided,
        "old_stopped_s": None,
        "old_saved_s": None,  # its result file written (after the checkpoint)
        "loaded_s": start["loaded_at"] - decided,
        "pause_s": None,  # no training: the old fragment's stop to the new one's first step
    }
    out["overhead_s"] = out["decision_to_first_step_s"] - out["step_s"]
    why = []
    if out["decision_to_first_step_s"] < 0:
        why.append("first step before the decision")
    if out["step_s"] <= 0:
        why.append("step time not positive")
    elif out["overhead_s"] < -max(NOISE_S, 0.1 * out["step_s"]):
        why.append("negative overhead beyond noise")
    if start.get("stopped_at") is not None:
        if start["loaded_at"] < start["stopped_at"]:
            why.append("checkpoint loaded before the old fragment stopped")
        if old is not None:  # a hand-over (a restart's pause is the benchmark's own wait)
            out["pause_s"] = start["first_step_at"] - start["stopped_at"]
            out["old_stopped_s"] = start["stopped_at"] - decided
            out["old_saved_s"] = (old.dir / "result.json").stat().st_mtime - decided
            if out["old_stopped_s"] < 0:
                why.append("old fragment stopped before the decision")
    elif case != "start":
        why.append("no checkpoint loaded")
    out["suspect"] = why
    return out


def measure_in_place(
    frag: Fragment, decided: float, old_size: int, case: str, ready_at: float | None = None
) -> dict:
    """An in-place resize's figures (``case`` shrink or grow), from the fragment's ``shrunk``
    or ``grown`` report (its first step at the new size, in the same processes) and the
    ``step`` report after it; ``ready_at``: when a grow's joiners were all set up."""
    resized, step = frag.first_steps({"shrink": "shrunk", "grow": "grown"}[case])
    steps = (step["samples"] - resized["samples"]) / GLOBAL_BATCH
    first = resized["first_step_at"] - decided
    step_s = (step["t"] - resized["first_step_at"]) / steps
    out = {"case": case, "from": old_size, "to": resized["world"]}
    out |= {"decision_to_first_step_s": first, "step_s": step_s, "overhead_s": first - step_s}
    # In place, "old stop" is when the ranks agreed on the request (and stopped stepping),
    # "loaded" when the communicator of the new size was set up (a grow's state sent), and
    # "pause" from the agreement to the first step at the new size.
    out["old_stopped_s"] = resized["agreed_at"] - decided
    out["loaded_s"] = resized["resized_at"] - decided
    out["pause_s"] = resized["first_step_at"] - resized["agreed_at"]
    out["old_saved_s"] = None
    out["ready_s"] = None if ready_at is None else ready_at - decided
    why = []
    if first < 0:
        why.append("first step before the decision")
    if steps <= 0:
        why.append("no step at the new size in the step time")
    if out["old_stopped_s"] < 0:
        why.append("resize agreed on before the decision")
    if step_s <= 0:
        why.append("step time not positive")
    elif out["overhead_s"] < -max(NOISE_S, 0.1 * step_s):
        why.append("negative overhead beyond noise")
    out["suspect"] = why
    return out


def ranks_cycle(
    tmp: Path,
    pool: RankPool | None,
    big: int,
    small: int,
    env: dict[str, str],
    emit: Callable[[dict], None],
) -> None:
    """start (big, from nothing) → preempted, restart (big) → shrink by hand-over (small) →
    grow by hand-over (big) → shrink in place (small) → grow in place (big); ``emit`` each
    case's figures."""
    live: list[Fragment] = []
    try:
        # 1. From zero nodes: no checkpoint.
        pool_ready(pool)
        frag = Fragment(tmp, 0, big, pool, env)
        decided = time.time()
        frag.launch()
        live.append(frag)
        emit(measure("start", frag, decided, 0))

        # 2. Preempted (SIGTERM: checkpoint, exit), then started again at the same size.
        frag.stop(signal.SIGTERM)
        live.remove(frag)
        pool_ready(pool)
        old, frag = frag, Fragment(tmp, 1, big, pool, env)
        decided = time.time()
        frag.launch()
        live.append(frag)
        emit(measure("restart", frag, decided, old.world))

        # 3, 4. The executor's warm hand-over: launch the new size with --after/--ready, stop
        # the old one once the new one is ready.
        for case, size in (("shrink_handover", small), ("grow_handover", big)):
            pool_ready(pool)
            old, frag = frag, Fragment(tmp, frag.gen + 1, size, pool, env, frag)
            decided = time.time()
            frag.launch()
            live.append(frag)
            ready = frag.dir / "ready"
            wait_until(ready.exists, poll=0.002, check=frag.check)
            ready_at = time.time()
            old.group.signal(signal.SIGUSR1)
            wait_until(lambda old=old: old.group.poll() is not None, poll=0.01)
            old.check()
            row = measure(case, frag, decided, old.world, ready_at, old)
            live.remove(old)
            emit(row)

        # 5. The same shrink in place: the kept ranks train on in memory, the others leave.
        decided = time.time()
        ShrinkRequest(tuple(range(small)), of=frag.world).write(frag.dir / "resize.json")
        emit(measure_in_place(frag, decided, frag.world, "shrink"))
        frag.world = small

        # 6. Grow in place: the joiners are launched at the decision; once all are set up,
        # the request; they connect and get the state from rank 0.
        pool_ready(pool)
        decided = time.time()
        joiners = Fragment(tmp, frag.gen + 1, big - small, pool, env, joins=frag)
        joiners.launch()
        live.append(joiners)
        rdv = frag.dir / "grow"
        wait_until(
            lambda: all(ready_file(rdv, g).exists() for g in range(1, joiners.of)),
            poll=0.002,
            check=joiners.check,
        )
        ready_at = time.time()
        GrowRequest(str(rdv), joiners.of, of=small, to=big).write(frag.dir / "resize.json")
        emit(measure_in_place(frag, decided, small, "grow", ready_at))
        frag.world = big
        frag.stop(signal.SIGTERM)  # the joiners stop with it: the ranks agree on a stop
        wait_until(lambda: joiners.group.poll() is not None, poll=0.01)
        joiners.check()
        live.remove(frag)
        live.remove(joiners)
    finally:
        for f in live:
            f.kill()


def ranks(
    mode: str, repeats: int, big: int, small: int, env: dict[str, str], suspect: list[str]
) -> dict:
    """``ranks-fork``, ``ranks`` or ``ranks-cold``: ``repeats`` cycles of the six cases;
    medians per case."""
    rows: dict[str, list[dict]] = {c: [] for c in CASES}
    pool = None
    if mode in ("ranks", "ranks-fork"):
        os.environ.update(env)  # the standbys' environment is the agent's: here, ours
        pool = RankPool(big, MPIEXEC, fork=mode == "ranks-fork")
        MARKS.append(pool.path)
    try:
        for rep in range(repeats):

            def emit(row: dict, rep: int = rep) -> None:
                rows[row["case"]].append(row)
                print(_ranks_row(mode, row), flush=True)
                suspect.extend(f"{mode} {row['case']} #{rep}: {why}" for why in row["suspect"])

            with tempfile.TemporaryDirectory(prefix="rescale-ranks-") as d:
                MARKS.append(d)
                ranks_cycle(Path(d), pool, big, small, env, emit)
    finally:
        if pool is not None:
            pool.close()
    out = {}
    for case, got in rows.items():
        good = [r for r in got if not r["suspect"]]
        fig = {
            k: _median([r[k] for r in good if r[k] is not None])
            for k in (
                "decision_to_first_step_s",
                "step_s",
                "overhead_s",
                "ready_s",
                "old_stopped_s",
                "old_saved_s",
                "loaded_s",
                "pause_s",
            )
        }
        fig["from"], fig["to"] = (got[0]["from"], got[0]["to"]) if got else (None, None)
        fig["n"] = len(good)
        over = fig["overhead_s"]
        fig["target_met"] = None if over is None else over <= TARGET_OVERHEAD_S
        out[case] = fig
    return out


def _ranks_row(mode: str, r: dict) -> str:
    def f(x: float | None) -> str:
        return f"{x:8.2f}" if x is not None else f"{'-':>8}"

    row = (
        f"{mode:>10} {r['case']:>15} {r['from']:>4} {r['to']:>3} "
        f"{f(r['decision_to_first_step_s'])} {f(r['step_s'])} {f(r['overhead_s'])} "
        f"{f(r['ready_s'])} {f(r['old_stopped_s'])} {f(r['old_saved_s'])} "
        f"{f(r['loaded_s'])} {f(r['pause_s'])}"
    )
    return row + (f"  SUSPECT: {'; '.join(r['suspect'])}" if r["suspect"] else "")


def through_executor(seconds: float, in_place: bool, env: dict[str, str]) -> dict:
    """One run of the executor (see the module docstring); medians and counts by kind."""
    import parsl
    from parsl.config import Config

    from parsl_bf.executor import BackfillExecutor, elastic_app
    from parsl_bf.executor.analysis import load_run, rescale_times
    from parsl_bf.providers import LocalBackfillProvider

    d = Path(tempfile.mkdtemp(prefix="bench-rescale-executor-"))
    MARKS.append(str(d))
    saved = dict(os.environ)
    os.environ.update(env | {THREADS_PER_RANK: "1"})  # an emulated node is a core
    provider = LocalBackfillProvider(
        nodes=2, time_scale=60, idle_s=1800, busy_s=300, max_nodes=1, min_walltime="1",
        grace_s=5, max_blocks=4, pin_cores=True,
    )  # fmt: skip
    provider.script_dir = str(d / "pilots")
    executor = BackfillExecutor(
        label="bf", provider=provider, rescale_s=1.0, walltime_notice_s=2.0,
        allocator={"tfwd": 5, "grow_in_place": in_place, "shrink_in_place": in_place},
    )  # fmt: skip
    train = elastic_app(
        TASK, work=10**9, min_nodes=1, max_nodes=2, scaling={1: 1.0, 2: 1.9}, rescale_s=1.0,
        executors=["bf"],
    )  # fmt: skip
    parsl.load(Config(executors=[executor], strategy_period=1, run_dir=str(d / "runinfo")))
    try:
        train(**OPTIONS)
        began = time.time()
        time.sleep(seconds)
        events, reports = load_run(executor.directory)
    finally:
        parsl.dfk().cleanup()
        parsl.clear()
        provider.close(timeout=60)  # every pilot's processes gone (their grace time included)
        os.environ.clear()
        os.environ.update(saved)
    times = rescale_times(events, reports, began, time.time())
    out = {}
    for kind, v in times.items():
        out[f"{kind}_s"] = _median(v)
        out[f"{kind}_n"] = len(v)
        if v:
            how = "in place" if in_place else "hand-over"
            each = ", ".join(f"{x:.2f}" for x in v)
            print(f"  executor {how}: {kind} {statistics.median(v):.2f} s over {len(v)} ({each})")
    shutil.rmtree(d, ignore_errors=True)
    return out


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _ours(marks: list[str]) -> list[str]:
    """Processes still running whose command line names one of ``marks`` (this run's
    temporary directories and pool socket): leftovers of this benchmark."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if any(m in cmd for m in marks):
                found.append(f"{pid} {cmd[:120]}")
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run: --repeats 1, modes {','.join(MODES_QUICK)}, executor in place only",
    )
    ap.add_argument(
        "--mode",
        default=",".join(MODES_ALL),
        help="comma-separated, of: standby (the new size started and set up before the "
        "decision, as a pilot's warm workers are), cold (started at the decision), ranks "
        "(warm ranks of a RankPool, ready before the decision: start, restart, shrink, grow), "
        "ranks-fork (the same, the ranks forked from the pool's rank host, as on CPU nodes), "
        "ranks-cold (the same four cases, every rank a cold mpiexec -n 1), executor (the "
        "controller's rescales through the executor, in place and by hand-over)",
    )
    ap.add_argument(
        "--executor-s", type=float, default=60.0, help="seconds per executor run (quick: 20)"
    )
    ap.add_argument(
        "--sizes",
        default="2,1",
        help="BIG,SMALL ranks: shrink BIG → SMALL, grow back (the docs' first table: 4,2)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        help="torch threads of every rank (PARSL_BF_THREADS_PER_RANK); default the worker's "
        "cores / ranks. On a loaded machine 1: a rank's 2 threads on 2 busy cores wait for "
        "each other at every operator (3-10x slower steps)",
    )
    ap.add_argument(
        "--handover",
        choices=MODES,
        default=HANDOVER[0],
        help="how a warm successor (shrink, grow) takes the state (the worker's --handover): "
        "the old ranks send it (peer), the checkpoint file (file), peer on a network file "
        "system only (auto, the default)",
    )
    args = ap.parse_args()
    HANDOVER[0] = args.handover
    env = {"PYTHONPATH": str(ROOT)}
    if args.threads:
        env[THREADS_PER_RANK] = str(args.threads)
    if args.quick:
        args.executor_s = min(args.executor_s, 20.0)
        if args.mode == ",".join(MODES_ALL):
            # Under 90 s: one mode of each function (ranks and ranks-fork differ only in the
            # pool's flag, cold and standby in when the successor starts).
            args.mode = ",".join(MODES_QUICK)
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    known = (*HANDOVER_MODES, *RANKS_MODES, "executor")
    bad = [m for m in modes if m not in known]
    if bad or not modes or modes == ["executor"]:
        ap.error(f"--mode: unknown {bad}; choose from {known}, not executor alone")
    big, small = (int(x) for x in args.sizes.split(","))
    if not big > small >= 1:
        ap.error("--sizes BIG,SMALL with BIG > SMALL ≥ 1")
    repeats = 1 if args.quick else args.repeats
    load_before = os.getloadavg()
    began = time.monotonic()
    suspect: list[str] = []
    results: dict[str, dict] = {}
    try:
        for mode in modes:
            if mode == "executor":
                print(f"\nexecutor: the controller's rescales, {args.executor_s:.0f} s per run")
                results[mode] = {
                    "in_place": through_executor(args.executor_s, True, env),
                    **({} if args.quick else {
                        "handover": through_executor(args.executor_s, False, env)
                    }),
                }  # fmt: skip
            elif mode in HANDOVER_MODES:
                print(f"\n{'mode':>10} {'rescale':>8} {'from':>4} {'to':>3} {'seconds':>8}")
                results[mode] = handover(mode, repeats, big, small, env, suspect)
            else:
                print(
                    f"\n{'mode':>10} {'case':>15} {'from':>4} {'to':>3} {'1st step':>8} "
                    f"{'step':>8} {'overhead':>8} {'ready':>8} {'old stop':>8} {'old save':>8} "
                    f"{'loaded':>8} {'pause':>8}   (seconds from the decision)"
                )
                results[mode] = ranks(mode, repeats, big, small, env, suspect)
    finally:
        time.sleep(0.5)  # a rank's session outlives its mpiexec by a moment
        leftovers = _ours(MARKS)
    for line in leftovers:
        print(f"LEFTOVER process: {line}")

    print(
        f"\nmedians of {repeats}, sizes {big} ↔ {small}, threads per rank "
        f"{args.threads or 'cores / ranks'}, load average "
        f"{load_before[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end "
        f"({time.monotonic() - began:.0f} s)"
    )
    for mode in modes:
        if mode in HANDOVER_MODES:
            r = results[mode]
            print(
                f"{mode:>10}: shrink {r['shrink_s']} s, grow {r['grow_s']} s "
                "(the paper's Elastic Horovod: 11-19 s)"
            )
    for mode in (m for m in modes if m in RANKS_MODES):
        print(
            f"\n{mode:>10} {'case':>15} {'1st step':>8} {'step':>8} {'overhead':>8} "
            f"{'target':>8} (overhead ≤ {TARGET_OVERHEAD_S} s)"
        )
        for case, r in results[mode].items():
            met = {None: "-", True: "met", False: "MISSED"}[r["target_met"]]
            cells = [r["decision_to_first_step_s"], r["step_s"], r["overhead_s"]]
            print(
                f"{'':>10} {case:>15} "
                + " ".join(f"{x:8.2f}" if x is not None else f"{'-':>8}" for x in cells)
                + f" {met:>8}  (n={r['n']})"
            )

    if "executor" in results:
        print(f"\n{'':>10} {'case':>15} {'direct':>8} {'executor':>8}   (decision → first step, s)")
        direct = results.get("ranks-fork") or results.get("ranks") or {}
        ran = results["executor"]
        pairs = [
            ("shrink", "in_place", "shrink_in_place_s"),
            ("grow", "in_place", "grow_in_place_s"),
            ("shrink_handover", "handover", "handover_s"),
            ("grow_handover", "handover", "handover_s"),
        ]
        for case, run, key in pairs:
            a = direct.get(case, {}).get("decision_to_first_step_s")
            b = ran.get(run, {}).get(key)
            print(f"{'':>10} {case:>15} " + " ".join(
                f"{x:8.2f}" if x is not None else f"{'-':>8}" for x in (a, b)))  # fmt: skip
    first = results[modes[0]]
    if modes[0] in HANDOVER_MODES:
        figures: dict = {"shrink_s": first["shrink_s"], "grow_s": first["grow_s"]}
    else:  # the warm host: start, restart, shrink and grow, and the step at the new size
        figures = {f"{c}_s": first[c]["decision_to_first_step_s"] for c in CASES}
        steps = [first[c]["step_s"] for c in CASES if first[c]["step_s"] is not None]
        figures["step_s"] = statistics.median(steps) if steps else None
        figures["overhead_s"] = {c: first[c]["overhead_s"] for c in CASES}
        figures["target_met"] = {c: first[c]["target_met"] for c in CASES}
    figures["mode"] = modes[0]
    figures["modes"] = {m: results[m] for m in modes if m in HANDOVER_MODES}
    if "executor" in results:  # the controller's decisions, beside the direct ones above
        figures["executor"] = results["executor"]
    for m in (m for m in modes if m in RANKS_MODES):
        figures[m.replace("-", "_")] = results[m]
    # Ratios of decision → first step: warm ranks against each baseline run alongside.
    ratios: dict[str, dict[str, float | None]] = {}
    for warm in ("ranks-fork", "ranks"):
        if warm not in results:
            continue
        name = warm.replace("-", "_")
        w = {c: results[warm][c]["decision_to_first_step_s"] for c in CASES}
        for base in ("cold", "standby"):
            if base in results:
                ratios[f"{name}_vs_{base}"] = {
                    k: _ratio(w[k], results[base][f"{k}_s"]) for k in ("shrink", "grow")
                }
        for base in ("ranks-cold", "ranks"):
            if base in results and base != warm:
                ratios[f"{name}_vs_{base.replace('-', '_')}"] = {
                    c: _ratio(w[c], results[base][c]["decision_to_first_step_s"]) for c in CASES
                }
    if "standby" in results and "cold" in results:
        ratios["standby_vs_cold"] = {
            k: _ratio(results["standby"][f"{k}_s"], results["cold"][f"{k}_s"])
            for k in ("shrink", "grow")
        }
    for name, r in ratios.items():
        print(f"ratio {name}: " + ", ".join(f"{k} {v}" for k, v in r.items()))
    figures["ratios"] = ratios
    figures |= {"sizes": [big, small], "repeats": repeats, "threads_per_rank": args.threads}
    figures["handover"] = args.handover
    figures["target_overhead_s"] = TARGET_OVERHEAD_S
    figures["load_avg"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    figures["suspect"] = suspect
    figures["leftover_processes"] = len(leftovers)
    for s in suspect:
        print(f"SUSPECT (left out of the medians): {s}")
    print(json.dumps(figures))
    return 1 if leftovers else 0


if __name__ == "__main__":
    sys.exit(main())
