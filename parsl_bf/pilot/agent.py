"""The pilot agent: runs inside each pilot job and starts processes for the executor.

``python -m parsl_bf.pilot.agent --url URL --secret-file FILE [--heartbeat-s 1.0]
[--warm-ranks MPIEXEC]``

It registers with the executor's :class:`~parsl_bf.executor.channel.PilotServer` (who it is:
``PARSL_BF_JOB_ID``, ``PARSL_BF_NODES``, ``PARSL_BF_PILOT_END``, as the providers export them)
over CurveZMQ, in a session of its own (see :mod:`parsl_bf.executor.channel`), heartbeats, and
runs the server's ``launch``, ``signal`` and ``shutdown`` commands, reporting each launched
process's exit. A SIGTERM or SIGUSR1 is a preemption: the grace time has begun. The agent
reports it at once, forwards SIGTERM to every launched process group (training ranks checkpoint
on it, or leave their fragment in place when it trains on elsewhere: ``--leave-min``), reports
their exits, says ``bye`` and exits 0 once they are gone.

The driver pings every few seconds. When nothing valid has come from it for ``silence_s`` (from
the welcome; 8 s by default) the agent logs ``driver silent``, TERMs every process group it
started, KILLs what is left :data:`LOST_GRACE_S` later, and exits 4: the ranks of a dead driver
do not go on training.

Plain apps (a ``launch`` with ``"warm": true`` whose argv is :func:`runner.command
<parsl_bf.pilot.outcome.command>`) are forked from the agent's warm host
(:mod:`parsl_bf.pilot.warmhost`, one per pilot, started with its first plain app: a pilot
that runs only fragments does not pay for its imports), not started as processes of their
own; to the executor they are processes as any other: their own group, signalled by key, their
exit reported. A host that dies is replaced, and the apps it had are reported as exited with -9
(lost: the executor runs a plain app again when it left no outcome); one that never forked (it
cannot start here) is not, and plain apps run as subprocesses.

Fragments' ranks (a ``launch`` with ``"ranks"``) start on the agent's
:class:`~parsl_bf.pilot.ranks.RankPool` (kept once the executor says ``warm_ranks``: there
is training to do), each rank its own MPI job: on a CPU node forked from the pool's rank host
into a relay's ``mpiexec`` (``PARSL_BF_FORK_RANKS=0``: not), on a GPU node a standby rank,
cold (``mpiexec -n 1``) when none is ready; the ranks of one launch are one process to the
executor (:class:`~parsl_bf.pilot.ranks.RankGroup`).
A pilot submitted once there is training (``--warm-ranks MPIEXEC``) starts its standbys, one per
node and GPU, before it registers: their imports then overlap the pilot's registration and the
executor's decision, instead of following them, and a fragment's first start on a fresh pilot
waits that much less.

Exit codes: 0 done (shutdown, preemption, pilot script gone), 2 bad arguments or secret file,
3 no ``welcome`` from the server (wrong secret or URL), 4 the driver fell silent.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from .. import environment
from .gpus import node_gpus
from .ranks import RankGroup, RankPool, killpg, launch_ranks
from .warmhost import WarmHost, WarmProc
from .wire import (
    AGENT_MODULE,
    RANKS_KEY,
    SILENCE_S,
    AgentSession,
    Op,
    RefusalLog,
    client_socket,
    read_secret,
    standbys_for,
)

__all__ = ["Agent", "Identity", "main"]

log = logging.getLogger(AGENT_MODULE)

EXIT_OK, EXIT_USAGE, EXIT_NO_WELCOME, EXIT_LOST = 0, 2, 3, 4

#: Signals the server may ask for, by name.
SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL, "USR1": signal.SIGUSR1}
#: Signals that mean the pilot is ending (a preemption; the grace time follows).
ENDING = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)
SHUTDOWN_GRACE_S = 10.0
#: After the driver fell silent: SIGTERM, then SIGKILL this much later.
LOST_GRACE_S = 1.0


@dataclass(frozen=True)
class Identity:
    """Who this agent is, as it registers."""

    pilot: str
    nodes: tuple[str, ...]
    ends_at: float | None
    host: str
    gpus: int = 0  # per node (the pilot's nodes are alike): one fragment rank runs per GPU

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Identity:
        """From the pilot's environment; outside a pilot: ``hostname:pid`` on this host."""
        env = dict(os.environ if env is None else env)
        host = socket.gethostname()
        nodes = tuple(
            n.strip() for n in env.get(environment.PILOT_NODES, "").split(",") if n.strip()
        )
        ends_at = None
        if env.get(environment.PILOT_END):
            try:
                ends_at = float(env[environment.PILOT_END])
            except ValueError:
                log.warning(
                    "%s=%r is not a time", environment.PILOT_END, env[environment.PILOT_END]
                )
        pilot = env.get(environment.PILOT_JOB_ID) or f"{host}:{os.getpid()}"
        return cls(pilot, nodes or (host,), ends_at, host, node_gpus(env))


class Agent:
    """One pilot's agent; :meth:`run` returns the exit code."""

    def __init__(
        self,
        url: str,
        secret: bytes,
        identity: Identity,
        heartbeat_s: float = 1.0,
        welcome_timeout_s: float = 30.0,
        warm_ranks: str | None = None,
    ) -> None:
        self.url, self.secret, self.identity = url, secret, identity
        self.warm_ranks = warm_ranks  # the mpiexec of standbys started at once; None: when asked
        self.heartbeat_s, self.welcome_timeout_s = heartbeat_s, welcome_timeout_s
        self.session = AgentSession(secret)
        self.refusals = RefusalLog(lambda refused: None, log)  # rate-limited log lines only
        self.procs: dict[str, subprocess.Popen | WarmProc | RankGroup] = {}
        self.host: WarmHost | None = None  # forks plain apps; None: none yet, or it cannot start
        self._host_broken = False  # it cannot start here: plain apps run as subprocesses
        self.pool: RankPool | None = None  # standby ranks, once the executor asks for them
        self._poller: zmq.Poller | None = None
        self._signals: list[int] = []
        self._welcomed = False
        self._silence_s = SILENCE_S  # the welcome may say otherwise
        self._next_beat = 0.0  # time.monotonic() of the next heartbeat
        self._lost = False  # the driver fell silent
        self._loop_at = 0.0  # time.monotonic() of the loop's last turn
        self._ending: str | None = None  # why we are leaving, once we are
        self._kill_at: float | None = None  # monotonic time to KILL what is left
        self._exit_code = EXIT_OK
        self._ppid = os.getppid()
        self._last_heard = 0.0  # time.monotonic() of the server's last message
        self._sock: zmq.Socket = None  # type: ignore[assignment]  # made by run()

    # --- messages ---------------------------------------------------------------------------

    def _send(self, msg: dict[str, Any]) -> None:
        if not self.session.established:  # nothing to tell before the welcome
            log.info("%r not sent: not registered yet", msg.get("op"))
            return
        self._sock.send_multipart(self.session.seal({**msg, "pilot": self.identity.pilot}))

    def _receive(self) -> None:
        while True:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            msg, reason = self.session.open(frames)
            if msg is None:
                self.refusals.add("the server", reason)
                continue
            self._last_heard = time.monotonic()
            try:
                self._handle(msg)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("malformed %r command ignored (%s): %r", msg.get("op"), exc, msg)

    def _handle(self, msg: dict[str, Any]) -> None:
        op = msg.get("op")
        if op == Op.WELCOME:
            if not self._welcomed:
                log.info("registered with %s", self.url)
            self._welcomed = True
            timeout = float(msg.get("heartbeat_timeout_s", 10.0))
            self._silence_s = float(msg.get("silence_s", SILENCE_S))
            # Several heartbeats per timeout, whatever --heartbeat-s says.
            self.heartbeat_s = min(self.heartbeat_s, timeout / 3)
            # At once: our first message in the session is what makes the pilot up.
            self._send({"op": Op.HEARTBEAT})
            self._next_beat = time.monotonic() + self.heartbeat_s
        elif op == Op.PING:
            pass
        elif op == Op.LAUNCH:
            self._launch(msg)
        elif op == Op.SIGNAL:
            self._signal_one(str(msg["key"]), str(msg["signal"]))
        elif op == Op.WARM_RANKS:
            self._start_pool(int(msg["size"]), str(msg["mpiexec"]))
        elif op == Op.SHUTDOWN:
            log.info("shutdown requested")
            self._leave("shutdown", kill_after=SHUTDOWN_GRACE_S)
        else:
            log.warning("unknown op %r ignored", op)

    # --- processes --------------------------------------------------------------------------

    def _launch(self, msg: dict[str, Any]) -> None:
        key = str(msg["key"])
        if key in self.procs:
            log.error("launch %s ignored: a process with that key is running", key)
            return
        if self._ending is not None:
            # Too late: report it as a process that got the preemption's SIGTERM at once.
            log.warning("launch %s refused: leaving (%s)", key, self._ending)
            self._send({"op": Op.EXITED, "key": key, "code": -signal.SIGTERM})
            return
        stdout, stderr = msg.get("stdout"), msg.get("stderr")
        try:
            argv = [str(a) for a in msg["argv"]]
            extra = {str(k): str(v) for k, v in (msg.get("env") or {}).items()}
            if RANKS_KEY in msg:
                if self.pool is not None:
                    # Standbys that became ready since the loop's last turn.
                    self.pool.serve(self._ranks_here())
                group = launch_ranks(
                    key, msg[RANKS_KEY], argv, extra, msg.get("cwd"), stdout, stderr,
                    self.pool, self.identity.host, _output,
                )  # fmt: skip
                self.procs[key] = group
                log.info("launched %s: %d rank(s), %d warm", key, len(group.procs), group.warm)
                return
            args = None
            if msg.get("warm"):
                # Imported here: the runner's module imports Parsl (0.5 s of CPU), which an
                # agent that runs only fragments never needs, at the start of every pilot.
                from . import outcome

                args = outcome.command_args(argv)
                if args is not None and self.host is None and not self._host_broken:
                    self._start_host()  # the app waits for its imports, as a process would
            if args is not None and self.host is not None:
                warm = self._launch_warm(key, args, extra, msg.get("cwd"), stdout, stderr)
                if warm is not None:
                    self.procs[key] = warm
                    log.info("forked %s from the warm host: %s", key, " ".join(argv))
                    return
            env = {**os.environ, **extra}
            with _output(stdout) as out, _output(stderr) as err:
                proc = subprocess.Popen(
                    argv,
                    env=env,
                    cwd=msg.get("cwd"),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,  # its own group: signals reach all it starts
                )
        except (OSError, ValueError, TypeError, KeyError) as exc:
            code = 127 if isinstance(exc, FileNotFoundError) else 126  # as a shell would say
            log.error("launch %s failed: %s", key, exc)
            if stderr:  # where the executor looks for what went wrong with this process
                with contextlib.suppress(OSError), open(stderr, "a") as f:
                    f.write(f"parsl-bf agent {self.identity.pilot}: launch failed: {exc}\n")
            self._send({"op": Op.EXITED, "key": key, "code": code})
            return
        self.procs[key] = proc
        log.info("launched %s (pid %d): %s", key, proc.pid, " ".join(argv))

    def _launch_warm(
        self, key: str, args: tuple[str, str], env: dict[str, str], cwd: str | None,
        stdout: str | None, stderr: str | None,
    ) -> WarmProc | None:  # fmt: skip
        """Ask the warm host to fork the app; ``None`` if it is gone (run it as a command).
        Raises what a subprocess's launch would: a missing ``cwd``, an output not writable."""
        assert self.host is not None
        with _output(stdout), _output(stderr):  # made here, appended to by the child
            pass
        if cwd is not None and not os.path.isdir(cwd):
            raise FileNotFoundError(f"no such directory: {cwd!r}")
        request = {"src": args[0], "out": args[1], "env": env, "cwd": cwd}
        try:
            return self.host.launch(key, {**request, "stdout": stdout, "stderr": stderr})
        except OSError as exc:
            log.warning("warm host unavailable (%s): %s runs as a process", exc, key)
            self._host_gone()
            return None

    def _start_host(self) -> None:
        try:
            self.host = WarmHost()
        except OSError as exc:
            log.warning("no warm host (%s): plain apps run as processes", exc)
            self.host, self._host_broken = None, True
            return
        log.info("warm host started (pid %d)", self.host.proc.pid)
        if self._poller is not None:
            self._poller.register(self.host.sock, zmq.POLLIN)

    def _start_pool(self, size: int, mpiexec: str) -> None:
        if self.pool is not None or self._ending is not None or size < 1:
            return
        try:
            # A GPU node's ranks leave most of its cores idle: a replacement warms up there
            # while they train. A CPU node's ranks use every core: they are forked from one
            # warm host (or, without it, a standby waits for a free slot).
            gpus = self.identity.gpus > 0
            fork = not gpus and os.environ.get(environment.FORK_RANKS, "1") != "0"
            self.pool = RankPool(size, mpiexec, refill_while_busy=gpus, fork=fork)
        except OSError as exc:
            log.warning("no standby ranks (%s): fragment ranks start cold", exc)
            return
        self.pool.fill()
        log.info("standby ranks: %d starting", size)
        others = [n for n in self.identity.nodes if n != self.identity.host]
        if self.identity.host in self.identity.nodes and others:
            # No agent runs on the pilot's other hosts: their ranks are started by mpiexec
            # through the job's steps, without the warm start.
            log.warning(
                "ranks on %s start cold: this pilot's standby ranks and rank host are on %s only",
                ",".join(others), self.identity.host,
            )  # fmt: skip

    def _ranks_here(self) -> int:
        """Ranks of launches running on this host: the standby slots they hold."""
        return sum(p.running_here for p in self.procs.values() if isinstance(p, RankGroup))

    def _stop_pool(self) -> None:
        """No more standbys; the rank host stays while its ranks end (:meth:`_close_pool`)."""
        if self.pool is not None:
            self.pool.stop()

    def _close_pool(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def _serve_host(self) -> None:
        if self.host is None or self.host.read():
            return
        self._host_gone()

    def _host_gone(self) -> None:
        host = self.host
        assert host is not None
        if self._poller is not None:
            with contextlib.suppress(KeyError):
                self._poller.unregister(host.sock)
        lost = sorted(host.apps)
        code = host.lost()
        self.host = None
        log.warning(
            "warm host (pid %d) exited with %d: %d plain app(s) lost%s",
            host.proc.pid,
            code,
            len(lost),
            f" ({', '.join(lost)})" if lost else "",
        )
        if not host.forked:
            log.warning("the warm host never forked an app: plain apps run as processes")
            self._host_broken = True
        elif self._ending is None:
            self._start_host()

    def _signal_one(self, key: str, name: str) -> None:
        sig = SIGNALS.get(name.upper().removeprefix("SIG"))
        if sig is None:
            log.warning("signal %r for %s ignored: not one of %s", name, key, ", ".join(SIGNALS))
            return
        proc = self.procs.get(key)
        if proc is None:  # it ended already; its exit is reported or on its way
            log.info("signal %s for %s ignored: no such process", name, key)
            return
        log.info("SIG%s to %s", sig.name.removeprefix("SIG"), key)
        _signal(proc, sig)

    def _signal_all(self, sig: int) -> None:
        for proc in self.procs.values():
            _signal(proc, sig)

    def _reap(self) -> None:
        for key, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None:
                continue
            # Leftovers in its group die with it, as processes of a batch job do (a rank
            # group's poll() saw to its own).
            if proc.pid is not None:
                killpg(proc.pid, signal.SIGKILL)
            del self.procs[key]
            log.info("%s exited with %d", key, code)
            self._send({"op": Op.EXITED, "key": key, "code": code})

    # --- leaving ----------------------------------------------------------------------------

    def _leave(self, why: str, kill_after: float | None = None, code: int = EXIT_OK) -> None:
        """TERM every process and leave once they are gone (KILL them after ``kill_after``)."""
        if self._ending is None:
            self._ending, self._exit_code = why, code
            self._signal_all(signal.SIGTERM)
            self._stop_pool()
        if kill_after is not None and self._kill_at is None:
            self._kill_at = time.monotonic() + kill_after

    def _preempted(self, name: str) -> None:
        if self._ending is not None:
            return
        log.warning("preempted (%s): SIGTERM to %d process group(s)", name, len(self.procs))
        self._send({"op": Op.PREEMPTED, "signal": name, "at": time.time()})
        self._leave(f"preempted ({name})")

    def _driver_silent(self, now: float) -> None:
        """Nothing valid from the driver for ``silence_s``: it is dead (or cut off), and so
        is the work of its processes. TERM them, KILL them soon after, then exit 4."""
        if self._lost:
            return
        self._lost = True
        log.error(
            "driver silent: nothing from %s for %.1f s: SIGTERM to %d process group(s), "
            "SIGKILL after %g s",
            self.url,
            now - self._last_heard,
            len(self.procs),
            LOST_GRACE_S,
        )
        if self._ending is None:  # else leaving already (preempted, shut down): TERMed, and 0
            self._signal_all(signal.SIGTERM)
            self._stop_pool()
            self._ending, self._exit_code = "driver silent", EXIT_LOST
        kill_at = now + LOST_GRACE_S
        self._kill_at = kill_at if self._kill_at is None else min(self._kill_at, kill_at)

    def _on_signal(self, signum: int, frame: object) -> None:
        self._signals.append(signum)  # handled in the loop; the wake-up fd ends its poll

    # --- the loop ---------------------------------------------------------------------------

    def run(self) -> int:
        """Register, serve until told to leave or preempted, return the exit code."""
        ctx = zmq.Context()
        self._sock = client_socket(ctx, self.secret)
        self._sock.connect(self.url)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        old_wakeup = signal.set_wakeup_fd(wake_w)
        for sig in (*ENDING, signal.SIGCHLD):  # SIGCHLD only wakes the loop to reap at once
            signal.signal(sig, self._on_signal)
        poller = self._poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(wake_r, zmq.POLLIN)
        code = EXIT_LOST
        try:
            code = self._serve(poller, wake_r)
            return code
        finally:
            if self.host is not None:
                self.host.close()
            self._close_pool()
            signal.set_wakeup_fd(old_wakeup)
            self.refusals.flush(force=True)
            # The last messages (exits, bye) still go out; to a silent driver, nothing would.
            self._sock.close(linger=0 if self._lost or code == EXIT_NO_WELCOME else 2000)
            ctx.term()
            os.close(wake_r)
            os.close(wake_w)

    def _serve(self, poller: zmq.Poller, wake_r: int) -> int:
        i = self.identity
        if self.warm_ranks is not None:  # the size the executor's warm_ranks would ask for
            self._start_pool(standbys_for(i.nodes, i.host, i.gpus), self.warm_ranks)
        registration = {"pilot": i.pilot, "nodes": list(i.nodes), "ends_at": i.ends_at}
        registration |= {"host": i.host, "gpus": i.gpus}
        self._sock.send_multipart(self.session.register(registration))
        log.info(
            "registering with %s: nodes %s, %d GPU(s) each", self.url, ",".join(i.nodes), i.gpus
        )
        started = self._last_heard = self._loop_at = time.monotonic()
        while True:
            # A rank waiting for a standby that is still starting: look for it often.
            waiting = self.pool is not None and self.pool.waiting
            ready = dict(poller.poll(timeout=5 if waiting else 200))
            turn = time.monotonic()
            if turn - self._loop_at > 2.0:
                # We stalled (a busy node, a suspended job): the driver's silence counts only
                # while we listen, and what it sent meanwhile may still be on its way in.
                self._last_heard += turn - self._loop_at
            self._loop_at = turn
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
            # Always read before judging the silence: after a stall of ours, what the driver
            # sent meanwhile is waiting here.
            self._serve_host()  # before launching more: exits, and whether it is still there
            self._receive()
            self.refusals.flush()
            while self._signals:
                signum = self._signals.pop(0)
                if signum != signal.SIGCHLD:
                    self._preempted(signal.Signals(signum).name.removeprefix("SIG"))
            self._reap()
            if self.pool is not None:
                self.pool.serve(self._ranks_here())
            now = time.monotonic()
            if not self._welcomed and now - started > self.welcome_timeout_s:
                print(
                    f"parsl-bf agent {i.pilot}: no welcome from {self.url} within "
                    f"{self.welcome_timeout_s:g} s: wrong --secret-file, or no executor "
                    "listens there",
                    file=sys.stderr,
                    flush=True,
                )
                return EXIT_NO_WELCOME
            if self._welcomed and now >= self._next_beat:
                self._send({"op": Op.HEARTBEAT})
                self._next_beat = now + self.heartbeat_s
            if self._welcomed and now - self._last_heard > self._silence_s:
                self._driver_silent(now)
            if os.getppid() != self._ppid and self._ppid != 1 and self._ending is None:
                # The pilot's script left (a preemption, or its walltime): so do we.
                log.warning("pilot script (pid %d) gone", self._ppid)
                self._preempted("PARENT")
            if self._kill_at is not None and now >= self._kill_at and self.procs:
                log.warning("SIGKILL to %d process group(s) left", len(self.procs))
                self._signal_all(signal.SIGKILL)
                self._kill_at = now + 1.0  # again, in case one was just forking
            if self._ending is not None and not self.procs:
                if self._lost:
                    log.error("exiting: the driver is silent")
                    return self._exit_code
                self._send({"op": Op.BYE, "reason": self._ending})
                log.info("bye (%s)", self._ending)
                return self._exit_code


@contextlib.contextmanager
def _output(path: str | None):
    """An append-mode file for a process's output (its directory made), or /dev/null."""
    if not path:
        yield subprocess.DEVNULL
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        yield f


def _signal(proc: subprocess.Popen | WarmProc | RankGroup, sig: int) -> None:
    """Signal a process's group; a warm app's as soon as the host says which it is."""
    if isinstance(proc, RankGroup):
        proc.signal(sig)
    elif proc.pid is None:
        assert isinstance(proc, WarmProc)
        proc.pending.append(sig)
    else:
        killpg(proc.pid, sig)


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit code."""
    parser = argparse.ArgumentParser(prog=f"python -m {AGENT_MODULE}", description=__doc__)
    parser.add_argument("--url", required=True, help="the executor's pilot server, tcp://HOST:PORT")
    parser.add_argument("--secret-file", required=True, help="the executor's secret (0600 file)")
    parser.add_argument("--heartbeat-s", type=float, default=1.0, help="seconds between beats")
    parser.add_argument(
        "--welcome-timeout-s",
        type=float,
        default=30.0,
        help="exit 3 if the server has not answered the registration by then",
    )
    parser.add_argument(
        "--warm-ranks",
        metavar="MPIEXEC",
        help="start a standby rank per node (per GPU) with this mpiexec before registering, "
        "rather than when the executor asks",
    )
    args = parser.parse_args(argv)
    identity = Identity.from_env()
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"%(asctime)s parsl-bf agent {identity.pilot} %(levelname)s: %(message)s",
    )
    try:
        secret = read_secret(args.secret_file)
    except (OSError, ValueError) as exc:
        print(f"parsl-bf agent {identity.pilot}: cannot read the secret: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.heartbeat_s <= 0:
        parser.error("--heartbeat-s must be positive")
    agent = Agent(
        args.url, secret, identity, args.heartbeat_s, args.welcome_timeout_s, args.warm_ranks
    )
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
