"""Warm ranks for a pilot's agent: standbys started ahead of need, and the ranks of one launch.

A fragment's launch on a pilot (:data:`~parsl_bf.pilot.wire.RANKS_KEY` in the ``launch``
message) names ``count`` ranks, the ``first`` of which is rank ``first`` of the fragment's
``of``. Each rank is its own MPI job and its own rendezvous group (``--group first+i --groups
of``), so that a rank can be one prepared before the decision or, when none is ready, a cold
``mpiexec -n 1`` of the same command: the two mix freely. The agent sees the ranks of one
launch as one process (:class:`RankGroup`), as it saw one ``mpiexec`` of them before: signalled
together, exited once all have, with the first failure's code; when one rank fails the others
are killed (what ``mpiexec`` does to a world that lost a rank).

:class:`RankPool` keeps one prepared rank starting or ready for each of its ``size`` rank
slots, listening for them on a Unix socket in a private (0700) directory. Two kinds:

* **relays**, on CPU nodes (``fork``): each an ``mpiexec -pmi-port -n 1`` of a bare
  interpreter (:mod:`parsl_bf.pilot.relay`), which costs no warm-up. A take sends the job
  and the relay's connection to the pool's rank host (:mod:`.warmhost` ``--ranks``), which has
  imported torch and the trainer once and forks the rank into the relay's MPI job. A taken
  relay is replaced as soon as it is ready (at once, if it was). A rank host that dies is
  replaced (its ranks live on); one that cannot warm up, or a launcher that gives its job no
  ``PMI_PORT`` (not MPICH's Hydra), turns the pool to standbys.
* **standbys** (:mod:`parsl_bf.pilot.standby`), on GPU nodes (a CUDA context does not
  survive a fork) or where forking cannot work: each a process that pays the imports and the
  first optimizer step before it is taken. A taken standby is replaced once its rank has
  exited: its warm-up (about 2 s of CPU) beside a rank that trains on the same core slows that
  rank even at niceness 19, and barely progresses meanwhile. On GPU nodes, whose ranks leave
  most cores idle, it is replaced while its rank trains instead, niced
  (``refill_while_busy``), so that a restart there finds it ready.

After ``size`` of them in a row died before they were ready, the pool gives up on relays
(standbys instead) or on standbys (its ranks start cold), since one that cannot start here
never will.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from .. import environment
from ..training.command import WORKER_MODULE
from . import relay as relay_module
from . import standby as standby_module
from .warmhost import WarmHost, killpg
from .wire import AGENT_MODULE

__all__ = [
    "RankGroup",
    "RankPool",
    "Standby",
    "killpg",
    "launch_ranks",
    "rank_argv",
]

log = logging.getLogger(AGENT_MODULE)

#: With ``refill_while_busy``, a taken standby is replaced this much later: a replacement's
#: imports would compete with the first steps of the fragment that took it.
REFILL_DELAY_S = 2.0


def rank_argv(argv: list[str], rank: int, ranks: int) -> list[str]:
    """One rank's command: its own rendezvous group of the fragment's ``ranks``."""
    return argv + ["--group", str(rank), "--groups", str(ranks)] if ranks > 1 else list(argv)


@dataclass
class Standby:
    """One standby: its ``mpiexec -n 1`` (its own process group) and, once ready, its socket.
    A relay (:mod:`parsl_bf.pilot.relay`) is one whose rank the pool's rank host forks."""

    proc: subprocess.Popen
    sock: socket.socket | None = None  # once it said ready
    #: The pid of its job's process (the standby, or the relay): Hydra starts it in a session
    #: of its own, so a signal to ``mpiexec``'s group reaches it only as Hydra forwards it
    #: (TERM, USR1), not a KILL.
    rank_pid: int | None = None
    job: bytes | None = None  # given while it was still starting: sent once it is ready
    nice: bool = False  # warming up at niceness 19 (a replacement)
    here: bool = True  # runs on the agent's host (a cold rank may run on another)
    relay: bool = False  # a relay: its rank is forked by the rank host
    pmi: dict[str, str] | None = None  # a ready relay's process-manager address (PMI_PORT, ...)
    taken_at: float | None = None  # time.time() of the launch that took it

    @property
    def ready(self) -> bool:
        return self.sock is not None

    def signal(self, sig: int) -> None:
        """Its ``mpiexec``'s group and, once known, the rank's own."""
        killpg(self.proc.pid, sig)
        if self.rank_pid is not None:
            killpg(self.rank_pid, sig)

    def send(self, job: bytes) -> bool:
        """Hand it its job; False if it died just now (the rank then is one that failed)."""
        assert self.sock is not None
        self.sock.setblocking(True)
        try:
            self.sock.sendall(job)
        except OSError:
            self.kill()
            return False
        self.sock.close()
        self.sock = None
        self.job = None
        return True

    def kill(self) -> None:
        """Gone, whatever it was doing (nothing yet, for a standby not taken)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.signal(signal.SIGKILL)


class RankPool:
    """Standbys of one agent's node(s), ``size`` of them kept starting or ready.

    Parameters
    ----------
    size : int
        Standbys to keep (one per rank slot the pilot has on this host).
    mpiexec : str
        The launcher that gives each standby its own MPI world (in the agent's environment).
    refill_while_busy : bool
        Replace a taken standby while its rank runs (niced, :data:`REFILL_DELAY_S` after the
        take), not once the rank has exited: for nodes whose ranks leave cores idle (GPUs).
    fork : bool
        Keep relays and fork their ranks from a rank host (CPU nodes: a CUDA context does not
        survive a fork); standbys instead if the host or the relays cannot start here.
    """

    def __init__(
        self, size: int, mpiexec: str, refill_while_busy: bool = False, fork: bool = False
    ) -> None:
        self.size, self.mpiexec, self.refill_while_busy = size, mpiexec, refill_while_busy
        self._dir = tempfile.mkdtemp(prefix="parsl-bf-ranks-")  # 0700: only we connect
        self.path = os.path.join(self._dir, "pool.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(64)
        self.listener.setblocking(False)
        #: Standbys not taken by a launch yet, by the token on their command line.
        self.standbys: dict[int, Standby] = {}
        self._tokens = 0
        self._pending: list[socket.socket] = []  # connected, not said which pid yet
        self.failed_starts = 0  # standbys that died before they were ready, in a row
        self.broken = False
        self.stopped = False  # the agent is leaving: no more standbys
        self._refill_at: float | None = None  # monotonic time to replace what launches took
        #: The rank host that forks the ranks of relays; None: standbys (GPU nodes, or forking
        #: cannot work here).
        self.host: WarmHost | None = None
        if fork:
            self._start_host()

    @property
    def waiting(self) -> bool:
        """A launch's rank waits for a standby still starting: serve often."""
        return any(s.job is not None for s in self.standbys.values())

    def _start_host(self) -> None:
        try:
            self.host = WarmHost(ranks=True)
        except OSError as exc:
            log.warning("no rank host (%s): standby ranks instead", exc)
            return
        log.info("rank host started (pid %d)", self.host.proc.pid)

    def _stop_forking(self, why: str) -> None:
        """Standbys from now on: kill the relays not taken (a launch waiting for one loses
        that rank, as to a standby that died) and the host."""
        log.warning("ranks cannot be forked here (%s): standby ranks instead", why)
        for token, s in list(self.standbys.items()):
            if s.relay:
                del self.standbys[token]
                s.kill()
                s.proc.wait()
        if self.host is not None:
            self.host.close()
            self.host = None
        self.failed_starts = 0

    def fill(self, nice: bool = False, slots: int | None = None) -> None:
        """Start standbys up to ``slots`` not taken (default ``size``; none once broken);
        ``nice``: at niceness 19 while they warm up (replacements, which start while ranks
        train on the same node)."""
        want = self.size if slots is None else min(slots, self.size)
        while not (self.broken or self.stopped) and self._filled() < want:
            self._tokens += 1
            relay = self.host is not None
            # A standby serves this host: its proxy is forked here, never started as a job
            # step on whichever node of the allocation the launcher would pick.
            # -pmi-port first: a site's wrapper that drops it (its ranks get PMI_FD) is
            # found by the missing PMI_PORT, whatever else it parses.
            argv = [self.mpiexec] + (["-pmi-port"] if relay else []) + ["-launcher", "fork"]
            if relay:  # a bare interpreter: no warm-up, so no competing with the ranks
                argv += ["-n", "1", sys.executable, "-I", "-S"]
                argv.append(relay_module.__file__)
            else:
                argv += ["-n", "1", sys.executable, "-m", standby_module.MODULE]
                argv += ["--nice"] if nice else []
            argv += ["--connect", self.path, "--token", str(self._tokens)]
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    start_new_session=True,  # its own group, as every process of the agent
                )
            except OSError as exc:
                log.warning("no standby rank (%s): fragment ranks start cold", exc)
                self.broken = True
                return
            self.standbys[self._tokens] = Standby(proc, nice=nice and not relay, relay=relay)

    def _filled(self) -> int:
        """The slots the pool's standbys fill: those not taken and, with relays, also those
        taken while still starting. A relay's ``mpiexec`` needs a job step of the pilot (under
        Slurm, a CPU of its node) before it is ready: a replacement started before the taken
        relay has its step may take that step and keep it, idle, while the taken relay and
        its rank wait for it (a fragment that never started, on one-CPU nodes). A standby
        taken while starting is already counted in ``busy`` (:meth:`serve`)."""
        if self.host is not None:
            return len(self.standbys)
        return sum(s.job is None for s in self.standbys.values())

    def serve(self, busy: int = 0) -> None:
        """Accept standbys that connected, read their ``ready``, forget those that died, and
        start one for each slot that no rank runs in (``busy``: this host's ranks running);
        with ``refill_while_busy``, replace those taken :data:`REFILL_DELAY_S` after the take
        instead. Relays are replaced once ready: they cost no warm-up."""
        if self.host is not None and not self.host.read():
            self._host_gone()
        if self.host is not None:
            self.fill()
        elif not self.refill_while_busy:
            self.fill(slots=self.size - busy)
        elif self._refill_at is not None and time.monotonic() >= self._refill_at:
            self._refill_at = None
            self.fill(nice=True)
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError, OSError):
                break
            conn.setblocking(False)
            self._pending.append(conn)
        for conn in list(self._pending):
            data = _recv(conn)
            if data is None:
                self._pending.remove(conn)
                conn.close()
            elif data:
                self._pending.remove(conn)
                line = data.split(b"\n", 1)[0]
                conn.recv(len(line) + 1)  # consumed: what is readable later is its end
                self._adopt(conn, line)
        for token, s in list(self.standbys.items()):
            if self.standbys.get(token) is not s:
                continue  # gone meanwhile: the relays a fall-back to standbys ended
            if s.sock is not None and _recv(s.sock) is None or s.proc.poll() is not None:
                self._died(token, s)

    def _host_gone(self) -> None:
        """The rank host died. Ranks it forked live on (their relays' jobs); a rank asked of it
        and not forked yet is lost (its relay sees its end). One that had warmed up is replaced;
        one that could not is not: standbys instead."""
        host, self.host = self.host, None
        assert host is not None
        code = host.lost()
        log.warning("rank host (pid %d) exited with %d", host.proc.pid, code)
        if host.ready and not self.stopped:
            self._start_host()
        else:
            self._stop_forking(f"the rank host exited with {code} before it was warm")

    def _adopt(self, conn: socket.socket, line: bytes) -> None:
        try:
            said = json.loads(line)
            rank_pid, s = int(said["ready"]), self.standbys.get(int(said["token"]))
            pmi = {str(k): str(v) for k, v in (said.get("pmi") or {}).items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            s = None
        if s is None or s.sock is not None:
            conn.close()
            return
        s.sock, s.rank_pid = conn, rank_pid
        self.failed_starts = 0
        if s.relay:
            if "PMI_PORT" not in pmi:  # not Hydra's -pmi-port: a forked rank has no world
                self._stop_forking(f"{self.mpiexec} -pmi-port gave its job no PMI_PORT")
                return
            s.pmi = pmi
        log.info("standby rank ready (pid %d)", rank_pid)
        if s.job is not None:  # taken while starting: its rank's job goes out now
            self._forget(s)
            self._hand(s, s.job)

    def _died(self, token: int, s: Standby) -> None:
        del self.standbys[token]
        ready = s.ready
        s.kill()
        code = s.proc.wait()
        if not ready:
            self.failed_starts += 1
            log.warning(
                "standby rank (mpiexec pid %d) exited with %d before it was ready",
                s.proc.pid,
                code,
            )
            if self.failed_starts >= self.size and s.relay:
                self._stop_forking(f"{self.failed_starts} relays in a row exited")
            elif self.failed_starts >= self.size:
                log.warning("standby ranks cannot start here: fragment ranks start cold")
                self.broken = True

    def take(self, job: bytes) -> Standby | None:
        """A standby for ``job`` (one JSON line), out of the pool, which starts its replacement
        a little later; None if there is none. A ready one gets the job now; else one still
        starting keeps it until it is ready (it started before the decision, so it is ahead of
        a cold start of the same rank, unless it warms up niced), and stays here, served, until
        then."""
        ready = [s for s in self.standbys.values() if s.ready and s.job is None]
        # Only one warming up at full priority is ahead of a cold start: a niced one would
        # hold the rank up while the fragment it replaces trains at full priority.
        starting = [
            s
            for s in self.standbys.values()
            if not s.ready and s.job is None and not s.nice and s.proc.poll() is None
        ]
        if not ready and not starting:
            return None
        if self._refill_at is None and self.refill_while_busy:
            self._refill_at = time.monotonic() + REFILL_DELAY_S
        s = ready[0] if ready else starting[0]
        s.taken_at = time.time()
        if ready:
            self._forget(s)
            return s if self._hand(s, job) else None
        s.job = job
        return s

    def _hand(self, s: Standby, job: bytes) -> bool:
        """Give a ready standby its job (a relay's goes to the rank host, which forks the rank
        with the relay's connection); False if it died just now or the host is gone (the rank
        then is one that failed)."""
        if not s.relay:
            return s.send(job)
        assert s.sock is not None
        request = json.loads(job) | {"pmi": s.pmi, "relay": s.rank_pid, "at": s.taken_at}
        try:
            if self.host is None:
                raise OSError("no rank host")
            self.host.fork_rank(request, s.sock.fileno())
        except OSError as exc:
            log.warning("rank of relay %s not forked: %s", s.rank_pid, exc)
            s.kill()
            return False
        s.sock.close()  # the rank's now: the relay sees its end when the rank's copy closes
        s.sock, s.job = None, None
        return True

    def _forget(self, s: Standby) -> None:
        for token, other in list(self.standbys.items()):
            if other is s:
                del self.standbys[token]

    def stop(self) -> None:
        """End every standby not taken, and start no more (the agent is leaving); the rank
        host stays until :meth:`close`, after the ranks it forked."""
        self.stopped = True
        for s in self.standbys.values():
            s.kill()
            s.proc.wait()
        self.standbys.clear()
        for conn in self._pending:
            conn.close()
        self._pending.clear()

    def close(self) -> None:
        """:meth:`stop`, then end the rank host and the socket."""
        self.stop()
        if self.host is not None:
            self.host.close()
            self.host = None
        self.listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _recv(conn: socket.socket) -> bytes | None:
    """What is waiting on ``conn`` (b"" if nothing), None once it is closed."""
    try:
        data = conn.recv(4096, socket.MSG_PEEK)
    except (BlockingIOError, InterruptedError):
        return b""
    except OSError:
        return None
    if not data:
        return None
    return data if b"\n" in data else b""


@dataclass
class RankGroup:
    """The ranks of one launch, as one process to the agent: ``poll()`` and ``signal()``."""

    key: str
    ranks: list[Standby] = field(default_factory=list)  # cold ones too (rank pid unknown)
    warm: int = 0  # how many came from standbys
    returncode: int | None = None
    pid: None = None  # no single group: the agent signals through signal()

    @property
    def procs(self) -> list[subprocess.Popen]:
        return [r.proc for r in self.ranks]

    @property
    def running_here(self) -> int:
        """Its ranks on the agent's host that have not exited: the pool's slots they hold."""
        return sum(r.here and r.proc.poll() is None for r in self.ranks)

    def signal(self, sig: int) -> None:
        for r in self.ranks:
            if r.proc.poll() is None:
                r.signal(sig)

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        codes = [p.poll() for p in self.procs]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            # A world that lost a rank is lost: mpiexec would kill the others, so do we.
            self.signal(signal.SIGKILL)
            for p in self.procs:
                p.wait()
            self.returncode = failed[0]
        elif all(c == 0 for c in codes):
            self.returncode = 0
        else:
            return None
        for r in self.ranks:
            r.signal(signal.SIGKILL)  # leftovers in their groups, as after any process
        return self.returncode


def launch_ranks(
    key: str,
    ranks: dict[str, Any],
    argv: list[str],
    env: dict[str, str],
    cwd: str | None,
    stdout: str | None,
    stderr: str | None,
    pool: RankPool | None,
    host: str,
    output,
) -> RankGroup:
    """Start a launch's ranks: each on a ready standby of ``pool`` when it runs on this
    ``host``, else as ``mpiexec -n 1 [-hosts H]`` of its command. ``output(path)`` opens a
    process's output file as the agent does. Raises what a process's launch would (OSError)."""
    first, count, total = int(ranks["first"]), int(ranks["count"]), int(ranks["of"])
    hosts = ranks.get("hosts")  # one per rank
    per_node = max(1, int(ranks.get("per_node", 1)))  # a node's ranks are consecutive
    if cwd is not None and not os.path.isdir(cwd):
        raise FileNotFoundError(f"no such directory: {cwd!r}")
    group = RankGroup(key)
    try:
        for i in range(count):
            command = rank_argv(argv, first + i, total)
            here = not hosts or hosts[i] == host
            worker = command[1:3] == ["-m", WORKER_MODULE]
            local = {environment.LOCAL_RANK: str(i % per_node)}
            rank_env = env | local | {environment.LOCAL_RANKS: str(per_node)}
            job = {"argv": command[3:], "env": rank_env, "cwd": cwd}  # its flags
            job |= {"stdout": stdout, "stderr": stderr}
            line = json.dumps(job).encode() + b"\n"
            standby = pool.take(line) if pool is not None and here and worker else None
            if standby is not None:
                group.ranks.append(standby)
                group.warm += 1
                continue
            cold = [str(ranks["mpiexec"]), "-n", "1"]
            if hosts:
                cold += ["-hosts", hosts[i]]
            with output(stdout) as out, output(stderr) as err:
                proc = subprocess.Popen(
                    cold + command,
                    env={**os.environ, **environment.RANK_STEP_ENV, **rank_env},
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
            group.ranks.append(Standby(proc, here=here))
    except BaseException:
        group.signal(signal.SIGKILL)
        raise
    return group
