"""Control-plane load: the BackfillExecutor under a 4,734-node machine's pilot churn.

The real executor (PilotServer, Controller, solver) against simulated agents.

Per size (``--sizes``, pilots sharing 4,734 nodes) a fresh process runs a real
``BackfillExecutor`` (a provider that launches nothing; no DFK) with ``--tasks`` elastic tasks.
``--workers`` processes serve the pilots, each in one loop (a timer heap and a zmq poller over
a CurveZMQ DEALER per pilot, sessions of ``channel.AgentSession``): ``register``, heartbeats,
``preempted`` → GRACE_S later the processes' ``exited`` → ``bye``. A launch's group 0 appends a
``step`` record to ``--report`` every REPORT_S (world: the launchers' ``-n``, met in the
rendezvous directory) and touches ``--ready``; TERM: ``--result`` ``{"status": "stopped"}``,
``exited`` 0 after STOP_S. No rank runs.

Load: every pilot registers within BURST_S (the trace's biggest burst: 4,601 node changes in
one 10-s sample); from t0 on, pilots are preempted (Poisson) and return as new pilots 3-22 s
later, so that node changes/s equal the trace's peak minute (an event moves 4,734/P nodes).
Figures by the phase of the triggering arrival, "churn" (``--duration`` s after the burst and
``--settle``) the headline: decision latency (events.jsonl), end to end at the agents
(``register`` → that pilot's first ``launch``; a fragment's last ``exited``, no warm successor
launched before, → its task's next ``launch``), messages/s inside the server (checked against
the agents' counts), the executor's RSS and its Controller's deep size, each solve's size and
status. Impossible figures (a negative latency, more messages received than sent, ...) are
anomalies; thread deaths, missed heartbeats, simulated agents behind schedule are warnings.
Prints a table, ends with one JSON line. ``--profile``: cProfile the decision thread;
``--policy exact``: the allocator's exact program instead of the MILP. Results in
docs/executor.md ("Control-plane load").
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import heapq
import io
import itertools
import json
import multiprocessing as mp
import os
import pstats
import queue
import random
import shutil
import statistics
import sys
import tempfile
import time
import types
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import zmq
from parsl.providers.base import ExecutionProvider

from parsl_bf.executor.lifecycle import LogEvent
from parsl_bf.pilot.wire import RANKS_KEY, AgentSession, Op, client_socket, read_secret
from parsl_bf.replay import missing_data
from parsl_bf.training.reports import ReportEvent, write_result

NODES, BURST_S, WORK = 4734, 10.0, 10**12
TASK = "benchmarks.control_plane:never_run"  # only passed in argv: no rank runs
GRACE_S, STOP_S, STARTUP_S, REPORT_S = 2.0, 0.5, 2.0, 1.0  # preemption, TERM, launch, steps
RATE1 = 1000.0  # simulated samples/s at world w: RATE1 * w**0.8


def never_run() -> None:
    raise RuntimeError("the benchmark's tasks never run")


def note(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))] if xs else None


def trace_peaks() -> dict[str, float]:
    """Node state changes/s over the dev trace's week (the whole of it), scaled to 4,734 nodes:
    the peak 10-s sample (the trace's resolution), minute, 10 minutes, hour; the mean."""
    import numpy as np

    from parsl_bf.inputs.trace import load_trace
    from parsl_bf.replay import default_data_dir

    tr = load_trace(default_data_dir() / "trace")
    scale = NODES / len(tr.nodes)
    times, counts = np.unique(tr.change_t[tr.change_t > 0], return_counts=True)
    cum = np.concatenate(([0], np.cumsum(counts)))
    out = {"sample_10s": float(counts.max()) / 10 * scale}
    for name, w in (("minute", 60), ("10min", 600), ("hour", 3600)):
        out[name] = float((cum[np.searchsorted(times, times + w)] - cum[:-1]).max()) / w * scale
    return out | {"mean": float(counts.sum()) / tr.end_s * scale}


def phase_of(t: float, c: dict) -> str:
    return "burst" if t < c["t0"] + c["churn_at"] else "churn" if t < c["t0"] + c["end"] else "post"


# --- simulated agents: one worker process serves many ----------------------------------------


@dataclass
class Proc:
    key: str
    task: str
    group: int
    groups: int
    ranks: int
    flags: dict[str, str]
    world: int | None = None
    exiting: bool = False


@dataclass
class Pilot:
    name: str
    sock: zmq.Socket
    wire: AgentSession
    procs: dict[str, Proc] = field(default_factory=dict)
    alive: bool = True
    leaving: bool = False
    welcomed: bool = False


class Agents:
    """The simulated agents of one worker process, served by one loop."""

    def __init__(self, c: dict) -> None:
        self.c, self.secret = c, read_secret(c["secret_file"])
        self.ctx = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, 16384)
        self.poller, self.by_sock, self.at_slot = zmq.Poller(), {}, {}
        self.timers: list = []
        self.seq = itertools.count()
        self.msgs: Counter = Counter()  # (phase, "sent"/"recv") → messages
        self.log: dict[str, list] = {"register": [], "launch": [], "exit": []}
        self.lag: list[float] = []  # timers fired late by
        self.samples: Counter = Counter()  # task → simulated samples
        self.errors: Counter = Counter()
        self.returns: Counter = Counter()  # slot → pilots so far

    def at(self, due: float, fn, *args) -> None:
        heapq.heappush(self.timers, (due, next(self.seq), fn, args))

    def send(self, p: Pilot, msg: dict | list[bytes]) -> None:
        """A message in the pilot's session (or frames made already: the register)."""
        if isinstance(msg, dict) and not p.wire.established:
            return  # as the real agent: nothing to tell before the welcome (a preemption then)
        frames = p.wire.seal({**msg, "pilot": p.name}) if isinstance(msg, dict) else msg
        try:
            p.sock.send_multipart(frames, zmq.NOBLOCK)
            self.msgs[(phase_of(time.time(), self.c), "sent")] += 1
        except zmq.Again:
            self.errors["send would block"] += 1

    def arrive(self, slot: int, hosts: list[str]) -> None:
        self.returns[slot] += 1
        sock = client_socket(self.ctx, self.secret)  # CurveZMQ, as the real agent's
        sock.connect(self.c["url"])
        p = Pilot(f"p{slot}.{self.returns[slot]}", sock, AgentSession(self.secret))
        self.at_slot[slot] = self.by_sock[sock] = p
        self.poller.register(sock, zmq.POLLIN)
        now = time.time()
        who = {"pilot": p.name, "nodes": hosts, "ends_at": now + 3600, "host": "sim"}
        self.send(p, p.wire.register(who))
        self.log["register"].append((p.name, now))

    def preempt(self, slot: int, hosts: list[str]) -> None:
        p = self.at_slot.get(slot)
        if p is None or not p.alive or p.leaving:
            return
        p.leaving, now = True, time.time()
        self.send(p, {"op": Op.PREEMPTED, "signal": "TERM", "at": now})
        for proc in list(p.procs.values()):
            self.stop(p, proc, now + GRACE_S)
        self.at(now + GRACE_S + 0.01, self.bye, p, "preempted (TERM)")

    def beat(self, p: Pilot) -> None:
        if p.alive:
            self.send(p, {"op": Op.HEARTBEAT})
            self.at(time.time() + 1.0, self.beat, p)

    def bye(self, p: Pilot, reason: str) -> None:
        if not p.alive:
            return
        for proc in list(p.procs.values()):
            self.exit(p, proc, -15)
        self.send(p, {"op": Op.BYE, "reason": reason})
        p.alive = False
        self.poller.unregister(p.sock)
        del self.by_sock[p.sock]
        p.sock.close(linger=1000)

    def stop(self, p: Pilot, proc: Proc, when: float) -> None:
        if not proc.exiting:
            proc.exiting = True
            if proc.group == 0:  # rank 0 checkpoints and leaves the fragment's result
                result = {"status": "stopped", "samples": int(self.samples[proc.task])}
                write_result(Path(proc.flags["result"]), result)
            self.at(when, self.exit, p, proc, 0)

    def exit(self, p: Pilot, proc: Proc, code: int) -> None:
        if p.alive and p.procs.get(proc.key) is proc:
            del p.procs[proc.key]
            self.send(p, {"op": Op.EXITED, "key": proc.key, "code": code})
            self.log["exit"].append((proc.key, time.time()))

    def launch(self, p: Pilot, msg: dict) -> None:
        key, argv, now = msg["key"], msg["argv"], time.time()
        self.log["launch"].append((p.name, key, now))
        if key in p.procs or key.count("#") != 2:
            self.errors["unexpected launch"] += 1
        elif p.leaving:  # as the real agent: too late, reported as killed by the preemption
            self.send(p, {"op": Op.EXITED, "key": key, "code": -15})
        else:
            flags = {a[2:]: b for a, b in zip(argv, argv[1:], strict=False) if a[:2] == "--"}
            task, _, group = key.split("#")
            spec = msg.get(RANKS_KEY)
            if spec is not None:  # warm ranks (the default): the launch names its world
                ranks = int(spec["count"])
                proc = Proc(key, task, int(group), 1, ranks, flags, world=int(spec["of"]))
            else:  # one mpiexec per launcher: the sizes meet in the rendezvous directory
                ranks, groups = int(argv[argv.index("-n") + 1]), int(flags.get("groups", 1))
                proc = Proc(key, task, int(group), groups, ranks, flags)
                if groups > 1:
                    Path(flags["rendezvous"]).mkdir(parents=True, exist_ok=True)
                    (Path(flags["rendezvous"]) / f"group{group}.n").write_text(str(ranks))
                else:
                    proc.world = ranks
            p.procs[key] = proc
            if proc.group == 0:
                self.at(now + STARTUP_S, self.step, p, proc)

    def step(self, p: Pilot, proc: Proc) -> None:
        if not p.alive or p.procs.get(proc.key) is not proc or proc.exiting:
            return
        now = time.time()
        if proc.world is None:
            found = list(Path(proc.flags["rendezvous"]).glob("group*.n"))
            if len(found) < proc.groups:
                return self.at(now + 0.2, self.step, p, proc)
            proc.world = sum(int(f.read_text()) for f in found)
        if "ready" in proc.flags:
            Path(proc.flags.pop("ready")).touch()  # a warm successor has built its model
        rate = RATE1 * proc.world**0.8
        self.samples[proc.task] += rate * REPORT_S
        step = {"t": now, "event": ReportEvent.STEP, "world": proc.world, "rate": rate, "loss": 1.0}
        with open(proc.flags["report"], "a") as f:
            f.write(json.dumps(step | {"samples": int(self.samples[proc.task])}) + "\n")
        self.at(now + REPORT_S, self.step, p, proc)

    def receive(self, p: Pilot) -> None:
        while p.alive:
            try:
                msg, why = p.wire.open(p.sock.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            self.msgs[(phase_of(time.time(), self.c), "recv")] += 1
            msg = msg or {"op": f"refused ({why})"}
            op, proc = msg.get("op"), p.procs.get(msg.get("key", ""))
            if op == Op.WELCOME and not p.welcomed:
                p.welcomed = True  # our first message in the session makes the pilot up
                self.beat(p)
            elif op == Op.LAUNCH:
                self.launch(p, msg)
            elif op == Op.SIGNAL and proc is not None and msg["signal"] in ("TERM", "KILL"):
                if msg["signal"] == "TERM":
                    self.stop(p, proc, time.time() + STOP_S)
                else:
                    self.exit(p, proc, -9)
            elif op == Op.SHUTDOWN:
                self.bye(p, "shutdown")
            elif op not in ("welcome", "ping", "signal", "warm_ranks"):  # no ranks to warm here
                self.errors[f"op {op}"] += 1

    def run(self) -> dict:
        c = self.c
        for slot, hosts, events in c["slots"]:
            for t, kind in events:
                self.at(c["t0"] + t, getattr(self, kind), slot, hosts)
        end, cpu0 = c["t0"] + c["end"], os.times()
        while (now := time.time()) < end:
            while self.timers and self.timers[0][0] <= now:
                due, _, fn, args = heapq.heappop(self.timers)
                self.lag.append(now - due)
                fn(*args)
                now = time.time()
            wait = min(self.timers[0][0] if self.timers else end, end) - now
            for sock, _ in self.poller.poll(max(1, int(wait * 1000) + 1)):
                if sock in self.by_sock:
                    self.receive(self.by_sock[sock])
        for sock in self.by_sock:
            sock.close(linger=0)
        self.ctx.term()
        cpu = os.times()
        return {"msgs": list(self.msgs.items()), "log": self.log, "errors": dict(self.errors)} | {
            "lag_p95": pct(self.lag, 95),
            "cpu_s": cpu.user + cpu.system - cpu0.user - cpu0.system,
        }


def _result(q, children: list, timeout: float):
    """The next item of ``q``, from one of ``children``; exit 1 at once (not after
    ``timeout``) when one of them died first: its traceback is on stderr already."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return q.get(timeout=0.5)
        except queue.Empty:
            pass
        dead = [p for p in children if p.exitcode not in (None, 0)]
        if dead:
            for p in children:
                p.kill()
            sys.exit(f"control_plane: {dead[0].name} exited with {dead[0].exitcode} (above)")
        if time.monotonic() > deadline:
            sys.exit(f"control_plane: no result from {len(children)} process(es) in {timeout} s")


def _agents_main(c: dict, q, go, t0) -> None:
    agents = Agents(c)
    q.put("ready")
    go.wait()
    c["t0"] = t0.value
    q.put(agents.run())


# --- the executor side -------------------------------------------------------------------------


class NullProvider(ExecutionProvider):
    """Launches nothing: the pilots' agents are simulated (and no DFK asks for blocks)."""

    label = "null"

    def __init__(self) -> None:
        self.min_blocks = self.max_blocks = self.init_blocks = self.submitted = 0
        self.nodes_per_block, self.parallelism, self.script_dir, self.resources = 1, 1.0, None, {}
        self.cores_per_node = self.mem_per_node = None

    def submit(self, command: str, tasks_per_node: int, job_name: str = "parsl.auto") -> object:
        self.submitted += 1

    def status(self, job_ids):
        return []

    def cancel(self, job_ids):
        return [False] * len(job_ids)

    @property
    def status_polling_interval(self) -> int:
        return 0


class Recorded:
    """The controller's allocator, recording each solve: (J, free nodes, status, seconds)."""

    def __init__(self, policy) -> None:
        self.policy, self.solves = policy, []

    def __getattr__(self, name: str):
        return getattr(self.policy, name)

    def __call__(self, problem):
        t = time.perf_counter()
        out = self.policy(problem)
        took = time.perf_counter() - t
        self.solves.append((len(problem.tasks), problem.free_nodes, str(out.status), took))
        return out


def schedule(pilots: int, c: dict, rng: random.Random) -> list[list[tuple[float, str]]]:
    """Per slot: (seconds from t0, "arrive"/"preempt"); see the module docstring."""
    per = [[(rng.uniform(0, BURST_S), "arrive")] for _ in range(pilots)]
    rate = c["node_rate"] / (NODES / pilots) / 2  # preemptions per s; as many returns follow
    t, live, back = 0.0, set(), sorted((ev[0][0], s) for s, ev in enumerate(per))
    while (t := t + rng.expovariate(rate)) < c["end"]:
        while back and back[0][0] <= t:
            live.add(heapq.heappop(back)[1])
        if live:
            s = rng.choice(sorted(live))
            live.remove(s)
            per[s] += [(t, "preempt"), (t + GRACE_S + rng.uniform(1, 20), "arrive")]
            heapq.heappush(back, (per[s][-1][0], s))
    return [[e for e in events if e[0] < c["end"]] for events in per]


def deep_bytes(root: object) -> int:
    """Bytes of the objects reachable from ``root`` (not classes, modules, functions)."""
    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)
    seen, stack, total = set(), [root], 0
    while stack:
        o = stack.pop()
        if id(o) not in seen and not isinstance(o, skip):
            seen.add(id(o))
            total += sys.getsizeof(o)
            stack.extend(gc.get_referents(o))
    return total


def _busy() -> float:
    """CPU seconds the whole machine has been busy (all but idle and iowait)."""
    cpu = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(cpu) - cpu[3] - cpu[4]) / os.sysconf("SC_CLK_TCK")


def _vm(name: str) -> float:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(name))
    return int(line.split()[1]) / 1024


def end_to_end(logs: list[dict], c: dict) -> dict[str, list[float]]:
    """Agent-side latencies (module docstring), by the phase of the triggering message."""
    out: dict[str, list[float]] = defaultdict(list)
    first, by_task, ended = {}, defaultdict(list), {}
    for t, pilot, key in sorted((t, p, k) for lg in logs for p, k, t in lg["launch"]):
        first.setdefault(pilot, t)
        by_task[key.split("#")[0]].append((t, int(key.split("#")[1])))
    for pilot, t in (x for lg in logs for x in lg["register"]):
        if pilot in first:
            out[f"register {phase_of(t, c)}"].append(first[pilot] - t)
    for key, t in (x for lg in logs for x in lg["exit"]):
        task, gen, _ = key.split("#")
        ended[(task, int(gen))] = max(t, ended.get((task, int(gen)), 0.0))
    for (task, gen), t in ended.items():
        later = [s for s, g in by_task[task] if g > gen]
        if later and min(later) >= t:  # relaunched after it, not a warm hand-over
            out[f"exit {phase_of(t, c)}"].append(min(later) - t)
    return out


def run_size(pilots: int, c: dict) -> dict:
    import threading

    from parsl_bf.executor import BackfillExecutor

    thread_errors: Counter = Counter()  # e.g. Pyomo's glpsol output reader, counted not printed
    threading.excepthook = lambda a: thread_errors.update([f"{a.exc_type.__name__}: {a.exc_value}"])
    tmp = Path(tempfile.mkdtemp(prefix="bench-control-plane-"))
    ex = BackfillExecutor(
        label="cp",
        provider=NullProvider(),
        max_tasks=c["max_tasks"],
        allocator={"policy": c["policy"]},
    )
    ex.run_dir = str(tmp)
    ex.controller.allocator = recorded = Recorded(ex.controller.allocator)
    prof = cProfile.Profile() if c["profile"] else None
    if prof is not None:
        loop = ex._loop
        ex._loop = lambda: prof.runcall(loop)
    ex.start()
    srv, counts = ex.server, [0, 0]  # messages the server received, sent
    receive, send_frames = srv._receive, srv._send_frames

    def counted_receive(*args):  # both on the server's thread
        counts[0] += 1
        receive(*args)

    def counted_send(*args):
        counts[1] += 1
        send_frames(*args)

    srv._receive, srv._send_frames = counted_receive, counted_send
    for _ in range(c["tasks"]):
        ex.submit(
            never_run, {"work": WORK, "task": TASK, "min_nodes": 1, "max_nodes": c["max_nodes"]}
        )
    base_mb = _vm("VmRSS:")
    sizes = (NODES // pilots + (i < NODES % pilots) for i in range(pilots))
    offsets = list(itertools.accumulate(sizes, initial=0))
    events = schedule(pilots, c, random.Random(c["seed"]))
    hosts = [[f"n{i:04d}" for i in range(offsets[s], offsets[s + 1])] for s in range(pilots)]
    slots = list(zip(range(pilots), hosts, events, strict=True))
    spawn = mp.get_context("spawn")
    q, go, t0v = spawn.Queue(), spawn.Event(), spawn.Value("d", 0.0)
    wc = c | {"url": srv.url, "secret_file": str(ex.secret_file)}
    workers = [
        spawn.Process(
            target=_agents_main, args=(wc | {"slots": slots[w :: c["workers"]]}, q, go, t0v)
        )
        for w in range(c["workers"])
    ]
    for w in workers:
        w.start()
    assert all(_result(q, workers, 120) == "ready" for _ in workers)
    c = c | {"t0": time.time() + 0.5}
    t0v.value = c["t0"]
    go.set()
    snaps, fds = [], 0  # (time, [received, sent], CPU s of this process) at t0, churn, end
    for at in (0.0, c["churn_at"], c["end"]):
        time.sleep(max(0.0, c["t0"] + at - time.time()))
        cpu = os.times()
        own = cpu.user + cpu.system + cpu.children_user + cpu.children_system
        snaps.append((time.time(), list(counts), own, _busy()))
        fds = max(fds, len(os.listdir("/proc/self/fd")))
    stats = [_result(q, workers, 120) for _ in workers]
    drained = time.time() + 60  # let the decision thread finish what arrived in the window
    while (ex._inbox.qsize() or ex._lock.locked()) and time.time() < drained:
        time.sleep(0.2)
    with ex._lock:
        controller_mb = deep_bytes(ex.controller) / 2**20
    rss_mb, hwm_mb = _vm("VmRSS:"), _vm("VmHWM:")
    ex.shutdown()
    for w in workers:
        w.join(timeout=30)

    decisions, gone = defaultdict(list), Counter()
    for e in map(json.loads, (ex.directory / "events.jsonl").read_text().splitlines()):
        if e["event"] == LogEvent.DECISION:
            decisions[phase_of(e["t"] - e["seconds"], c)].append(e)
        gone[e.get("reason")] += e["event"] == LogEvent.PILOT_GONE
    e2e = end_to_end([s["log"] for s in stats], c)
    agent_msgs = sum((Counter(dict(s["msgs"])) for s in stats), Counter())
    r = {"pilots": pilots, "gone": {x: n for x, n in gone.items() if n}}
    bad, warn = r["anomalies"], r["warnings"] = [], []
    for ph, a, b in (("burst", 0, 1), ("churn", 1, 2)):
        secs, ds = snaps[b][0] - snaps[a][0], decisions[ph]
        lat, solves = [d["seconds"] for d in ds], [d["solve_s"] for d in ds if d["solve_s"]]
        lo, hi = (0.0, c["churn_at"]) if ph == "burst" else (c["churn_at"], c["end"])
        offered = sum(lo <= t < hi for ev in events for t, _ in ev) / (hi - lo)
        r[ph] = {
            **{"decisions": len(ds), "p50": pct(lat, 50), "p95": pct(lat, 95)},
            **{"max": max(lat, default=None), "solves": len(solves), "solve_p95": pct(solves, 95)},
            "events_per_decision": statistics.mean(d["events"] for d in ds) if ds else None,
            "in_per_s": (snaps[b][1][0] - snaps[a][1][0]) / secs,
            "out_per_s": (snaps[b][1][1] - snaps[a][1][1]) / secs,
            **{"pilot_events_per_s": offered, "node_changes_per_s": offered * NODES / pilots},
            **{"register": e2e[f"register {ph}"], "exit": e2e[f"exit {ph}"]},
            "cores": (snaps[b][2] - snaps[a][2]) / secs,
        }
        if min(lat + e2e[f"register {ph}"] + e2e[f"exit {ph}"], default=0) < 0:
            bad.append(f"P{pilots} {ph}: a negative latency")
        if any(d["solve_s"] and d["solve_s"] > d["seconds"] + 2e-3 for d in ds):
            bad.append(f"P{pilots} {ph}: a solve longer than its decision")
        if offered and not ds:
            warn.append(f"P{pilots} {ph}: no decision on the events that arrived")
    ours = {d: sum(n for (ph, x), n in agent_msgs.items() if x == d) for d in ("sent", "recv")}
    slack = 50 + 0.01 * max(snaps[2][1])  # messages in flight at the windows' edges
    if snaps[2][1][0] - snaps[0][1][0] > ours["sent"] + slack:
        bad.append(f"P{pilots}: the server received more messages than the agents sent")
    if ours["recv"] > snaps[2][1][1] - snaps[0][1][1] + slack:
        bad.append(f"P{pilots}: the agents received more messages than the server sent")
    if not 0 < controller_mb < rss_mb:
        bad.append(f"P{pilots}: controller {controller_mb:.1f} MB against RSS {rss_mb:.1f} MB")
    warn += [
        f"P{pilots}: simulated agents: {e} ×{n}" for s in stats for e, n in s["errors"].items()
    ]
    warn += [f"P{pilots}: executor thread died ×{n}: {e}" for e, n in thread_errors.items()]
    if gone.get("missed heartbeats"):
        warn.append(f"P{pilots}: {gone['missed heartbeats']} pilots missed their heartbeats")
    if (lag := max(s["lag_p95"] or 0.0 for s in stats)) > 0.25:
        warn.append(f"P{pilots}: simulated agents behind their schedule, p95 {lag:.2f} s")
    agents_cpu, secs = sum(s["cpu_s"] for s in stats), snaps[2][0] - snaps[0][0]
    if prof is not None:
        buf = io.StringIO()
        for key, n in (("cumulative", 30), ("tottime", 15)):
            pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(key).print_stats(n)
        r["profile"] = buf.getvalue()
    if not c["keep"]:
        shutil.rmtree(tmp, ignore_errors=True)
    return r | {
        **{"rss_mb": rss_mb, "hwm_mb": hwm_mb, "base_mb": base_mb, "controller_mb": controller_mb},
        **{"lag_p95": lag, "fds": fds, "solve_log": recorded.solves},
        "agents_cores": agents_cpu / secs,
        "others_cores": (snaps[2][3] - snaps[0][3] - agents_cpu - snaps[2][2] + snaps[0][2]) / secs,
    }


def _size_main(pilots: int, c: dict, q) -> None:
    q.put(run_size(pilots, c))


# --- main --------------------------------------------------------------------------------------

C, B = "churn", "burst"
ROWS = (  # (JSON key, phase, figure, format); phase None: the run's. The table prints them all.
    ("decision_p95_s", C, lambda x: x["p95"], ".3f"),
    ("decision_p50_s", C, lambda x: x["p50"], ".3f"),
    ("messages_per_s", C, lambda x: x["in_per_s"] + x["out_per_s"], ".0f"),
    ("rss_mb", None, lambda r: r["rss_mb"], ".1f"),
    ("decision_max_s", C, lambda x: x["max"], ".3f"),
    ("decisions", C, lambda x: x["decisions"], "d"),
    ("events_per_decision", C, lambda x: x["events_per_decision"], ".1f"),
    ("solve_p95_s", C, lambda x: x["solve_p95"], ".3f"),
    ("e2e_register_launch_p50_s", C, lambda x: pct(x["register"], 50), ".3f"),
    ("e2e_register_launch_p95_s", C, lambda x: pct(x["register"], 95), ".3f"),
    ("e2e_register_launch_n", C, lambda x: len(x["register"]), "d"),
    ("e2e_exit_launch_p50_s", C, lambda x: pct(x["exit"], 50), ".3f"),
    ("e2e_exit_launch_p95_s", C, lambda x: pct(x["exit"], 95), ".3f"),
    ("e2e_exit_launch_n", C, lambda x: len(x["exit"]), "d"),
    ("messages_in_per_s", C, lambda x: x["in_per_s"], ".0f"),
    ("messages_out_per_s", C, lambda x: x["out_per_s"], ".0f"),
    ("events_per_s_offered", C, lambda x: x["pilot_events_per_s"], ".2f"),
    ("node_changes_per_s_offered", C, lambda x: x["node_changes_per_s"], ".1f"),
    ("executor_cores", C, lambda x: x["cores"], ".2f"),
    ("burst_decision_p95_s", B, lambda x: x["p95"], ".3f"),
    ("burst_decision_max_s", B, lambda x: x["max"], ".3f"),
    ("burst_e2e_register_launch_p95_s", B, lambda x: pct(x["register"], 95), ".3f"),
    ("burst_messages_per_s", B, lambda x: x["in_per_s"] + x["out_per_s"], ".0f"),
    ("rss_before_agents_mb", None, lambda r: r["base_mb"], ".1f"),
    ("rss_peak_mb", None, lambda r: r["hwm_mb"], ".1f"),
    ("controller_mb", None, lambda r: r["controller_mb"], ".2f"),
    ("executor_fds", None, lambda r: r["fds"], "d"),
    ("solves", None, lambda r: len(r["solve_log"]), "d"),
    ("solves_not_optimal", None, lambda r: sum(x[2] != "optimal" for x in r["solve_log"]), "d"),
    ("agents_lag_p95_s", None, lambda r: r["lag_p95"], ".3f"),
    ("agents_cores", None, lambda r: r["agents_cores"], ".2f"),
    ("other_processes_cores", None, lambda r: r["others_cores"], ".2f"),
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,1000", help="pilots per run (default 100,1000)")
    ap.add_argument("--duration", type=float, default=60.0, help="churn phase, s (default 60)")
    ap.add_argument("--settle", type=float, default=10.0, help="s after the burst (default 10)")
    ap.add_argument("--quick", action="store_true", help="12 s churn, 3 s settle (about 70 s)")
    ap.add_argument("--tasks", type=int, default=500, help="elastic tasks (default 500)")
    ap.add_argument("--max-tasks", type=int, default=100, help="running at once (default 100)")
    ap.add_argument("--max-nodes", type=int, default=64, help="a task's max_nodes (default 64)")
    ap.add_argument("--policy", default="milp", help="the allocator's policy (default milp)")
    ap.add_argument("--workers", type=int, default=2, help="agent processes (default 2)")
    ap.add_argument("--profile", action="store_true", help="cProfile the decision thread")
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    args = ap.parse_args()
    if why := missing_data():
        print(f"error: {why}", file=sys.stderr)  # bench-quick: skipped
        return 2
    if args.quick:
        args.duration, args.settle = 12.0, 3.0
    peaks = trace_peaks()
    c = {"churn_at": BURST_S + args.settle, "end": BURST_S + args.settle + args.duration}
    c |= {k: getattr(args, k) for k in ("tasks", "max_tasks", "max_nodes", "workers", "policy")}
    c |= {"node_rate": peaks["minute"], "profile": args.profile, "keep": args.keep, "seed": 1}
    head = (
        f"trace (bftrainer-dev week, 4,734 nodes, read whole): node state changes/s at peak per "
        f"10-s sample {peaks['sample_10s']:.0f}, per minute {peaks['minute']:.1f}, per 10 min "
        f"{peaks['10min']:.1f}, per hour {peaks['hour']:.1f}; mean {peaks['mean']:.2f}.\n"
        f"Offered: every pilot registers within {BURST_S:.0f} s, then {c['node_rate']:.1f} node "
        f"changes/s (preemptions, returns); churn measured {args.duration:.0f} s from "
        f"{BURST_S + args.settle:.0f} s. {args.tasks} elastic tasks (1..{args.max_nodes} nodes, "
        f"{args.max_tasks} at once), allocator policy {args.policy}"
    )
    note(head)
    spawn, results = mp.get_context("spawn"), {}
    for pilots in map(int, args.sizes.split(",")):
        note(f"P{pilots}: {NODES / pilots:.1f} nodes per pilot, {c['end']:.0f} s of load")
        q = spawn.Queue()
        proc = spawn.Process(target=_size_main, args=(pilots, c, q))
        proc.start()
        results[f"P{pilots}"] = r = _result(q, [proc], c["end"] + 600)
        proc.join(timeout=60)
        note(f"P{pilots}: done, {len(r['solve_log'])} solves")

    figures: dict = {}
    print(f"{head}; load average {os.getloadavg()[0]:.2f} at the end\n")
    print(f"{'':<32}" + "".join(f"{size:>10}" for size in results))
    for key, ph, fn, spec in ROWS:
        values = {k: fn(r if ph is None else r[ph]) for k, r in results.items()}
        print(
            f"{key:<32}"
            + "".join(f"{'-' if v is None else format(v, spec):>10}" for v in values.values())
        )
        figures[key] = {
            k: v if v is None or spec == "d" else round(v, int(spec[1]) + 1)
            for k, v in values.items()
        }
    for size, r in results.items():
        slow = sorted(r["solve_log"], key=lambda x: -x[3])[:4]
        print(
            f"{size}: pilots gone {r['gone']}; slowest solves (tasks, free nodes, status, s): ",
            end="",
        )
        print("; ".join(f"{j}, {n}, {st}, {t:.2f}" for j, n, st, t in slow))
    print(
        "\nchurn figures unless burst_; decision_*: events.jsonl, a batch's first arrival → its "
        "commands queued to the pilots, by the phase of that arrival; e2e_*: at the agents "
        "(module docstring); messages: counted inside the PilotServer; *_offered: by the "
        "schedule; executor_cores: its process's CPU, glpsol included; controller_mb: deep size "
        "of the Controller; executor_fds: most open at once; other_processes_cores: the rest of "
        "the machine meanwhile"
    )
    anomalies = [a for r in results.values() for a in r["anomalies"]]
    warnings = [a for r in results.values() for a in r["warnings"]]
    print(
        "\n".join(
            [f"ANOMALY (cannot be true): {a}" for a in anomalies]
            + [f"WARNING: {w}" for w in warnings]
        )
    )
    for size, r in results.items():
        if r.get("profile"):
            print(f"\ncProfile of the decision thread, {size}:\n{r['profile']}")
    figures["trace_node_changes_per_s"] = {k: round(v, 2) for k, v in peaks.items()}
    figures |= {"duration_s": args.duration, "quick": args.quick, "policy": args.policy}
    figures |= {"profiled": args.profile, "anomalies": anomalies, "warnings": warnings}
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
