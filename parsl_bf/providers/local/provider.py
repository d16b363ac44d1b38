"""``LocalBackfillProvider``: an emulated backfill cluster on this machine (the embedded default).

K emulated nodes follow an idle-node trace (a window and node subset of the shipped format,
time-compressed) or a synthetic idle/busy cycle. ``submit()`` sizes each pilot to the best
current hole (:func:`~parsl_bf.providers.sizing.size_pilot`: the most node-seconds of idle,
unclaimed nodes; the emulator knows the trace's future, as a scheduler knows a pending job's
planned start).
Pilots are real local processes. When the trace takes back one of a pilot's nodes, or its
walltime ends, the pilot gets SIGTERM, then SIGKILL after the grace time, like a real
preemption, and is reported as ``JobState.TIMEOUT`` (never FAILED, which would make Parsl give
up on the provider). A pilot's nodes and end time are in ``provider.pilots[job_id]`` and in
its environment (``PARSL_BF_NODES``, ``PARSL_BF_PILOT_END``).

The emulation runs in a thread while the provider has live pilots (a later ``submit()``
starts it again); ``close()`` ends every pilot and waits for that thread. A pilot's first
process is reaped only once none of its processes is left, and never signalled after: its pid,
which is also the id of its process group and session, cannot be recycled meanwhile, so a
signal meant for a pilot cannot reach another process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from parsl.jobs.states import TERMINAL_STATES, JobState
from parsl.launchers import SingleNodeLauncher
from parsl.launchers.base import Launcher

from ... import environment
from ...checks import SettingError, check_count, check_number
from ...decisions import PilotEnd
from ...inputs.trace import IdleTrace, load_trace
from ..base import Pilot, check_blocks, check_walltimes, python_bin
from ..pilots import PilotProvider
from ..sizing import Hole, size_pilot
from .emulation import NodeStates, synthetic_trace

__all__ = ["LocalBackfillProvider"]

log = logging.getLogger(__name__)


@dataclass
class _Job:
    pilot: Pilot
    command: str
    tasks_per_node: int
    proc: subprocess.Popen | None = None
    term_sent: float | None = None  # wall time of the SIGTERM
    kill_sent: float | None = None  # wall time of the first SIGKILL, after the grace time
    out: Path | None = None
    err: Path | None = None


def _processes() -> Iterator[tuple[int, int, int]]:
    """``(pid, ppid, session)`` of every live process (Linux /proc; zombies left out)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields[0] not in ("Z", "X"):  # a zombie is dead, only not reaped yet
            yield int(stat.parent.name), int(fields[1]), int(fields[3])


def _session_tree(sid: int) -> list[int]:
    """Processes of session ``sid`` and all their descendants, even those that started
    sessions of their own (Linux /proc): what a batch system's job container holds."""
    children: dict[int, list[int]] = {}
    members: list[int] = []
    for pid, ppid, session in _processes():
        children.setdefault(ppid, []).append(pid)
        if session == sid:
            members.append(pid)
    out: list[int] = []
    stack = list(members)
    while stack:
        pid = stack.pop()
        if pid not in out:
            out.append(pid)
            stack.extend(children.get(pid, []))
    return out


def _exited(proc: subprocess.Popen) -> bool:
    """Whether ``proc`` has exited, without reaping it: until :func:`_reap`, its pid (the id
    of its process group and session too) stays reserved, so signalling them is safe."""
    if proc.returncode is not None:
        return True
    if not hasattr(os, "waitid"):  # no way to look without reaping
        return proc.poll() is not None
    try:
        seen = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped elsewhere: record it, and signal it no more
        proc.poll()
        return True
    return seen is not None and seen.si_pid == proc.pid


def _session_alive(sid: int) -> bool:
    """Whether a live process other than its (exited, unreaped) leader is left in session
    ``sid``; where there is no /proc, whether its process group is."""
    if not Path("/proc/self/stat").exists():
        try:
            os.killpg(sid, 0)
        except ProcessLookupError:
            return False
        return True
    return any(session == sid and pid != sid for pid, _, session in _processes())


class LocalBackfillProvider(PilotProvider):
    """Pilots on an emulated backfill cluster whose idle nodes follow a trace.

    Parameters
    ----------
    nodes : int
        Emulated nodes (default: this machine's cores).
    trace : str, Path or None
        Trace directory (bftrainer-dev format: ``nodes.csv``, ``events.csv.gz``); None for a
        synthetic idle/busy cycle. In a YAML config a relative path is relative to the file.
    node_offset : int
        First node of the trace to use, by ``col_index``.
    trace_start : float
        Trace second at which the emulation starts.
    time_scale : float
        Trace seconds per wall-clock second (120: one trace hour passes in 30 s).
    idle_s, busy_s : float
        Synthetic cycle of each node, in trace seconds (used when ``trace`` is None).
    min_nodes, max_nodes : int
        Nodes per pilot; a pilot waits for a hole of at least ``min_nodes``.
    min_walltime, max_walltime : str
        Wall-clock bounds of a pilot ("HH:MM:SS"); a hole shorter than the minimum is not used.
    grace_s : float
        Seconds between SIGTERM and SIGKILL at preemption, walltime end or cancel.
    known_holes : bool
        True: a pilot's walltime is its hole's length (the scheduler knows when the next main
        job starts there). False: pilots ask for ``max_walltime`` and are preempted when the
        trace takes a node back (main jobs nobody announced).
    launcher, worker_init, init_blocks, min_blocks, max_blocks, parallelism
        As for Parsl's providers.
    poll_s : float
        Seconds between two ticks of the emulation (node states, preemptions, pilot exits).
    pin_cores : bool
        Run each pilot on its nodes' cores only (emulated node ``i`` is core ``i`` mod this
        machine's cores; Linux affinity, which its processes inherit), so that one node's
        process start-ups do not take CPU from another node's training, as on a real machine.
        Meant for ``nodes`` up to the cores (the executor benchmark); with more, nodes share
        cores unevenly. False (the default): every pilot may use every core.
    hosts : list of str or None
        Hosts the emulated nodes run on: node ``i`` (by position in the trace window) is
        ``hosts[i % len(hosts)]``, and a pilot's processes start there through
        ``host_command``, so that a fragment spanning pilots on two hosts talks over the
        network. None (the default): every node is this machine. Pilots are then one node
        each (``max_nodes`` 1): a pilot starts on one host and has no way to reach another.
    host_command : str
        The command prefix that runs a command on a host, ``{host}`` replaced by its name
        (for example ``scripts/slurm-loopback.sh on {host}`` on the separate hosts of the
        loopback cluster). It must keep the environment and the working directory (as
        ``nsenter`` does; ``ssh`` does neither) and pass signals to the command.
    """

    #: Every emulated node is this machine: the executor gives each rank one thread.
    emulated = True

    def __init__(
        self,
        nodes: int | None = None,
        trace: str | Path | None = None,
        node_offset: int = 0,
        trace_start: float = 0.0,
        time_scale: float = 120.0,
        idle_s: float = 1800.0,
        busy_s: float = 600.0,
        min_nodes: int = 1,
        max_nodes: int | None = None,
        min_walltime: str = "00:00:20",
        max_walltime: str = "01:00:00",
        grace_s: float = 5.0,
        known_holes: bool = True,
        launcher: Launcher | None = None,
        worker_init: str = "",
        init_blocks: int = 0,
        min_blocks: int = 0,
        max_blocks: int = 4,
        parallelism: float = 1.0,
        poll_s: float = 0.1,
        pin_cores: bool = False,
        hosts: list[str] | None = None,
        host_command: str = "",
    ) -> None:
        # Every check raises SettingError naming the argument (the YAML loader points at its
        # line), here rather than at the first submit(): a bad value there would fail in the
        # emulation thread, and the workflow would wait for pilots that never start.
        self.nodes = (os.cpu_count() or 1) if nodes is None else check_count("nodes", nodes)
        check_count("node_offset", node_offset, 0)
        if trace is not None:
            trace = os.path.expanduser(trace) if isinstance(trace, str) else trace.expanduser()
            where = Path(trace)
            if not where.is_dir():
                cwd = "" if where.is_absolute() else f" (relative to {Path.cwd()})"
                raise SettingError("trace", f"no such directory: {str(trace)!r}{cwd}")
            missing = [n for n in ("nodes.csv", "events.csv.gz") if not (where / n).is_file()]
            if missing:
                raise SettingError(
                    "trace", f"{str(trace)!r} is not a trace directory: no {', '.join(missing)}"
                )
            with (where / "nodes.csv").open() as f:
                n_trace = sum(1 for line in f if line.strip()) - 1  # less the header
            if node_offset >= n_trace:
                raise SettingError(
                    "node_offset", f"{node_offset} is past the trace's {n_trace} nodes"
                )
        check_number("trace_start", trace_start, at_least=0)
        check_number("time_scale", time_scale, above=0)
        check_number("idle_s", idle_s, above=0)  # never idle: no pilot would ever start
        check_number("busy_s", busy_s, at_least=0)
        check_count("min_nodes", min_nodes)
        if min_nodes > self.nodes:
            raise SettingError(
                "min_nodes", f"{min_nodes} is more than nodes ({self.nodes}): no pilot could start"
            )
        if max_nodes is not None and check_count("max_nodes", max_nodes) < min_nodes:
            raise SettingError("min_nodes", f"{min_nodes} is more than max_nodes ({max_nodes})")
        walltimes = check_walltimes(min_walltime, max_walltime)
        check_number("grace_s", grace_s, at_least=0)
        check_blocks(init_blocks, min_blocks, max_blocks)
        check_number("parallelism", parallelism, at_least=0, at_most=1)
        check_number("poll_s", poll_s, above=0)
        if hosts is not None:
            if not hosts or not all(isinstance(h, str) and h for h in hosts):
                raise SettingError("hosts", "a list of host names, at least one")
            if "{host}" not in host_command:
                raise SettingError("host_command", "needs {host}: the command that runs on it")
            if (max_nodes or self.nodes) > 1:
                raise SettingError(
                    "max_nodes", "must be 1 with hosts: a pilot's processes start on one host"
                )
        super().__init__("local-backfill", status_polling_interval=1)
        # Parsl's RepresentationMixin (repr in logs) needs each argument as an attribute.
        self.trace, self.node_offset, self.trace_start = trace, node_offset, trace_start
        self.time_scale, self.idle_s, self.busy_s = time_scale, idle_s, busy_s
        self.min_nodes, self.max_nodes = min_nodes, max_nodes or self.nodes
        self.min_walltime, self.max_walltime = min_walltime, max_walltime
        self.min_walltime_s, self.max_walltime_s = walltimes
        self.grace_s, self.poll_s = grace_s, poll_s
        self.pin_cores = pin_cores
        self.hosts, self.host_command = hosts, host_command
        self._warned_pin = False
        self.known_holes = known_holes
        self.launcher, self.worker_init = launcher or SingleNodeLauncher(), worker_init
        self.init_blocks, self.min_blocks, self.max_blocks = init_blocks, min_blocks, max_blocks
        self.parallelism = parallelism
        self._jobs: dict[str, _Job] = {}
        self._states: NodeStates | None = None
        self._t0 = 0.0
        self._thread: threading.Thread | None = None  # the emulation, while pilots are live

    # --- the emulated machine ---------------------------------------------------------------

    def _trace(self) -> IdleTrace:
        if self.trace is None:
            horizon = self.trace_start + 10 * 86400
            return synthetic_trace(self.nodes, self.idle_s, self.busy_s, horizon)
        return load_trace(self.trace, self.nodes, self.node_offset)

    def _clock(self) -> float:
        """Now. At the first call the emulated machine is built and its trace clock starts,
        so that the first pilot is sized at ``trace_start`` exactly."""
        if self._states is None:
            self._states = NodeStates(self._trace())
            self._t0 = time.time()
            return self._t0
        return time.time()

    def _start(self) -> None:
        """Start the emulation thread if none runs (called with the lock held)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="local-backfill", daemon=True)
            self._thread.start()

    def trace_time(self, wall: float | None = None) -> float:
        """The emulated trace second at wall-clock time ``wall`` (now by default)."""
        return self.trace_start + ((wall or time.time()) - self._t0) * self.time_scale

    def _live(self) -> bool:
        return any(job.pilot.state not in TERMINAL_STATES for job in self._jobs.values())

    def _loop(self) -> None:
        while True:
            with self._lock:
                if not self._live():  # nothing left to emulate: a later submit() restarts us
                    self._thread = None
                    return
                try:
                    self._tick(time.time())
                except Exception:  # keep emulating: a broken tick must not freeze every pilot
                    log.exception("local backfill emulation tick failed")
            time.sleep(self.poll_s)

    def _tick(self, now: float) -> None:
        with self._lock:  # the node states too: submit() ticks from the caller's thread
            assert self._states is not None
            t = self.trace_time(now)
            idle = self._states.idle_at(t)
            held = set()
            for job in self._jobs.values():
                if job.pilot.state is JobState.RUNNING:
                    self._watch(job, idle, now)
                    if job.pilot.state is JobState.RUNNING:
                        held.update(job.pilot.nodes)
            for job in self._jobs.values():
                if job.pilot.state is JobState.PENDING:
                    nodes = self._place(job, idle, held, t, now)
                    held.update(nodes)

    def _watch(self, job: _Job, idle, now: float) -> None:
        pilot = job.pilot
        assert job.proc is not None and self._states is not None
        exited = _exited(job.proc)  # not reaped: its pid stays ours to signal
        if job.term_sent is not None:
            # Ended by our signal: done once none of its processes is left, gone by itself
            # within the grace time or killed after it.
            if exited and not _session_alive(job.proc.pid):
                self._reap(job)
                cancelled = pilot.reason == PilotEnd.CANCELLED
                pilot.state = JobState.CANCELLED if cancelled else JobState.TIMEOUT
            elif now - job.term_sent >= self.grace_s:
                if job.kill_sent is None:
                    job.kill_sent = now
                    log.info(
                        "pilot %s: still there after %g s: SIGKILL", pilot.job_id, self.grace_s
                    )
                self._signal(job, signal.SIGKILL)
            return
        if exited:
            self._signal(job, signal.SIGKILL)  # leftovers die with the job, as in a batch system
            code = self._reap(job)
            pilot.state = JobState.COMPLETED if code == 0 else JobState.FAILED
            pilot.reason = f"exit code {code}"
            return
        index = self._states.index
        if pilot.ends_at is not None and now >= pilot.ends_at:
            self._terminate(job, "walltime", now)
        elif not all(idle[index[n]] for n in pilot.nodes):
            self._terminate(job, "preempted", now)

    def _place(self, job: _Job, idle, held: set[str], t: float, now: float) -> list[str]:
        """Start ``job`` on the best current hole, if there is one; returns its nodes."""
        states = self._states
        assert states is not None
        free = [i for i, name in enumerate(states.names) if idle[i] and name not in held]
        holes = [
            Hole(
                states.names[i],
                "idle",
                (states.idle_until(i, t) - t) / self.time_scale if self.known_holes else None,
            )
            for i in free
        ]
        request = size_pilot(
            holes, self.min_nodes, self.max_nodes, self.min_walltime_s, self.max_walltime_s
        )
        if request is None:
            return []
        self._launch(job, list(request.hosts), now, request.walltime_s)
        return list(request.hosts)

    # --- processes --------------------------------------------------------------------------

    def _launch(self, job: _Job, nodes: list[str], now: float, walltime_s: float) -> None:
        pilot = job.pilot
        pilot.nodes, pilot.started_at, pilot.ends_at = nodes, now, now + walltime_s
        pilot.state = JobState.RUNNING
        script = f"{self.worker_init}\n{self.launcher(job.command, job.tasks_per_node, 1)}\n"
        directory = Path(self.script_dir or ".")
        directory.mkdir(parents=True, exist_ok=True)
        job.out = directory / f"{pilot.job_id}.stdout"
        job.err = directory / f"{pilot.job_id}.stderr"
        self.resources[pilot.job_id] |= {
            "job_stdout_path": str(job.out),
            "job_stderr_path": str(job.err),
        }
        env = {
            **os.environ,
            "PATH": os.pathsep.join(p for p in (python_bin(), os.environ.get("PATH")) if p),
            environment.PILOT_NODES: ",".join(nodes),
            environment.PILOT_END: f"{pilot.ends_at:.3f}",
            environment.PILOT_JOB_ID: pilot.job_id,
        }
        argv = ["/bin/bash", "-c", script]
        if self.hosts:  # the pilot's own variables by name: a host's command may reset others
            assert self._states is not None
            host = self.hosts[self._states.index[nodes[0]] % len(self.hosts)]
            own = [f"{k}={env[k]}" for k in (
                environment.PILOT_NODES, environment.PILOT_END, environment.PILOT_JOB_ID
            )]  # fmt: skip
            argv = [*shlex.split(self.host_command.replace("{host}", host)), "env", *own, *argv]
        taskset = shutil.which("taskset") if self.pin_cores else None
        if taskset is not None:  # before the shell runs anything: every process inherits it
            assert self._states is not None
            cores = {self._states.index[n] % (os.cpu_count() or 1) for n in nodes}
            argv = [taskset, "--cpu-list", ",".join(map(str, sorted(cores))), *argv]
        elif self.pin_cores and not self._warned_pin:
            self._warned_pin = True
            log.warning("pin_cores: no taskset here (util-linux); pilots use every core")
        with job.out.open("w") as out, job.err.open("w") as err:
            job.proc = subprocess.Popen(
                argv, stdout=out, stderr=err, env=env, start_new_session=True
            )
        log.info("pilot %s started on %s for %.0f s", pilot.job_id, ",".join(nodes), walltime_s)

    def _signal(self, job: _Job, sig: int) -> None:
        """Signal the pilot's whole process group (its session); SIGKILL also reaches every
        descendant in a session of its own, as a batch system's job container would. Never
        once its first process is reaped: its pid may then be another process's."""
        if job.proc is None or job.proc.returncode is not None:
            return
        if sig == signal.SIGKILL:
            for pid in _session_tree(job.proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        with contextlib.suppress(ProcessLookupError):  # nobody left
            os.killpg(job.proc.pid, sig)

    @staticmethod
    def _reap(job: _Job) -> int:
        """Reap the pilot's exited first process (it is never signalled after); its exit
        code, negative for a signal."""
        assert job.proc is not None
        return job.proc.wait()

    def _terminate(self, job: _Job, reason: str, now: float) -> None:
        job.pilot.reason = reason
        job.term_sent = job.pilot.signalled_at = now
        self._signal(job, signal.SIGTERM)
        log.info("pilot %s: %s, SIGTERM sent", job.pilot.job_id, reason)

    # --- Parsl's provider interface ----------------------------------------------------------

    def submit(self, command: str, tasks_per_node: int, job_name: str = "parsl.auto") -> str:
        """Queue a pilot; it starts on the best hole as soon as one is there."""
        with self._lock:
            now = self._clock()
            self._count += 1
            job_id = f"{job_name}.{self._count}"
            pilot = Pilot(job_id)
            self.pilots[job_id] = pilot
            self._jobs[job_id] = _Job(pilot, command, tasks_per_node)
            self.resources[job_id] = {"job_id": job_id}
            self._tick(now)  # place it now if a hole exists
            self._start()
        return job_id

    def _end(self, job_ids: list[str]) -> None:
        """A waiting pilot is dropped; a running one gets SIGTERM, SIGKILL after the grace
        time, and is CANCELLED once its processes are gone (one already ending, e.g.
        preempted, keeps its reason and grace time)."""
        now = time.time()
        for job_id in job_ids:
            job = self._jobs[job_id]
            if job.pilot.state is JobState.PENDING:
                job.pilot.state, job.pilot.reason = JobState.CANCELLED, PilotEnd.CANCELLED
            elif job.term_sent is None:
                self._terminate(job, "cancelled", now)

    def close(self, timeout: float | None = None) -> None:
        """End every live pilot (as ``cancel()``) and wait, up to ``timeout`` seconds (default
        ``grace_s`` + 10), until their processes are gone and the emulation thread has
        stopped. The provider stays usable: a later ``submit()`` starts the emulation again."""
        with self._lock:
            self.cancel(
                [j for j, job in self._jobs.items() if job.pilot.state not in TERMINAL_STATES]
            )
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.grace_s + 10 if timeout is None else timeout)
