"""The warm host: runs plain apps in workers forked once from a process that has imported the
runner already.

``python -m parsl_bf.pilot.warmhost FD``, started by the agent (one per pilot, with its first
plain app), ``FD`` its end of a Unix socket pair. Starting a Python that imports Parsl and
unpacks the app costs about a second per plain app, and even a fork of this process costs
3.7 ms; the host pays them once, as HTEX's worker pool does. It stays single-threaded (no
ZeroMQ in it) so that forking is safe.

The agent sends one JSON line per app, ``{key, src, out, env, cwd, stdout, stderr}``. The host
gives it to an idle worker, forking one if none is idle. A worker is in a session of its own
(its own process group, as the agent's subprocesses are: the agent signals the group by the
worker's pid). For each app it restores what a fresh interpreter would have: the environment
it was forked with plus ``env`` (``PYTHONPATH`` entries in ``sys.path`` too), ``cwd``, default
signal handlers, no ``atexit`` handlers; it points fds 0, 1, 2 at ``/dev/null``, ``stdout`` and
``stderr`` (appending), runs :func:`parsl_bf.pilot.runner.main` on ``[src, out]``, runs the
app's ``atexit`` handlers, and KILLs what the app left in its process group. The host answers
``{key, pid}`` once a worker has the app and ``{key, code, alive: true}`` when it is done, or
``{key, code}`` (negative: killed by that signal, as :attr:`subprocess.Popen.returncode` says)
when the worker died with it, in that order per key.

``python -m parsl_bf.pilot.warmhost FD --ranks`` is a rank host instead, one per pilot on a
CPU node, started by the agent's :class:`~parsl_bf.pilot.ranks.RankPool`: it imports torch,
mpi4py (without initialising MPI) and the trainer and does one optimizer step
(:func:`warm_ranks`), says ``{ready}``, and then forks one rank per request: the job of a
standby rank (:mod:`parsl_bf.pilot.standby`) plus the ``pmi`` address, ``relay`` pid and
start time ``at`` of a relay (:mod:`parsl_bf.pilot.relay`), whose connection comes with
the request (``SCM_RIGHTS``). The rank is what the standby would have been, in a session of its
own: it initialises MPI in its relay's job, runs :func:`parsl_bf.training.worker.main`, and
hands its exit code to the relay (:func:`_rank`). A rank does not depend on its host: the agent
signals and reaps it through its relay's ``mpiexec``, and a host that dies or is closed leaves
its ranks training (a closed one reaps them first, for :data:`RELAY_EXIT_S`).

The host never outlives the agent: the kernel KILLs it when the agent dies (Linux's
``PR_SET_PDEATHSIG``), and it exits when its socket closes or its parent changes, KILLing
the process groups of its workers; an idle worker ends when the host's end of its socket
closes. It ignores the signals that mean a preemption (the agent forwards those to each app's
group itself).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, NoReturn

__all__ = ["MODULE", "WarmHost", "WarmProc", "killpg", "main", "serve", "warm_ranks"]

#: The host's module (``python -m``).
MODULE = "parsl_bf.pilot.warmhost"

#: Signals the agent handles (a preemption); the host leaves them to it.
IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
PR_SET_PDEATHSIG = 1
#: How long a forked rank waits for its relay to be gone before it exits anyway.
RELAY_EXIT_S = 5.0


def killpg(pgid: int, sig: int) -> None:
    """Signal a process group; one that is gone already is no error (nobody left)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return  # elsewhere: the socket's EOF and the parent check end the host
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class _Baseline:
    """What a worker restores before each app: the environment and ``sys.path`` it was forked
    with (signal handlers go back to their defaults in :func:`_run_app`)."""

    def __init__(self) -> None:
        self.environ = dict(os.environ)
        self.path = list(sys.path)


def _become(req: dict[str, Any], base: _Baseline, env: dict[str, str]) -> None:
    """In a forked child: what a fresh interpreter started for ``req`` would have: the
    environment it was forked with plus ``env`` (``PYTHONPATH`` entries in ``sys.path`` too),
    ``req``'s ``cwd`` and output files, default signal handlers, no ``atexit`` handlers."""
    signal.set_wakeup_fd(-1)
    for sig in (*IGNORED, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh interpreter
    atexit._clear()  # the host's (or the last app's) exit handlers are not this one's
    if req.get("cwd"):
        os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(base.environ)
    os.environ.update(env)
    # What a fresh `python -m` would have on sys.path: the cwd first, then PYTHONPATH.
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *extra, *(p for p in base.path[1:] if p not in extra)]
    if extra:
        importlib.invalidate_caches()
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    for fd, path in ((1, req.get("stdout")), (2, req.get("stderr"))):
        f = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666) if path else null
        os.dup2(f, fd)
        if f != null:
            os.close(f)
    os.close(null)


def _strings(mapping: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in (mapping or {}).items()}


def _run_app(req: dict[str, Any], base: _Baseline) -> int:
    """In a worker: set up as the app's process would be, run the app; its exit code."""
    from . import runner  # imported by the host already (main)

    _become(req, base, _strings(req.get("env")))
    args = [str(req["src"]), str(req["out"])]
    sys.argv = [runner.__file__, *args]
    try:
        code = runner.main(args)
        for t in threading.enumerate():  # a fresh interpreter waits for them at exit too
            if t is not threading.main_thread() and not t.daemon:
                t.join()
        atexit._run_exitfuncs()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    return code


def warm_ranks() -> None:
    """Make this process a rank host: what every rank pays before its task's code (torch,
    the trainer, mpi4py, a first optimizer step), without initialising MPI, which each forked
    rank does in its own job's world, nor starting threads, which a fork would not copy."""
    import mpi4py

    mpi4py.rc.initialize = False  # each rank: MPI.Init() with its relay's PMI address
    mpi4py.rc.finalize = False  # and MPI_Finalize in worker.exit_now, before its relay goes
    import torch

    torch.set_num_threads(1)  # no OpenMP pool here; each rank sizes its own (share_cores)
    from . import standby

    standby.warm_up()


def _rank(req: dict[str, Any], base: _Baseline, relay: socket.socket) -> NoReturn:
    """A forked rank: tell the relay who it is, become the rank's process, initialise MPI in
    the relay's world, run the trainer, and hand the exit code to the relay (its ``mpiexec``'s
    code) before exiting; if the relay dies first (a KILL to the job), KILL this group."""
    done = threading.Event()

    def watch() -> None:
        with contextlib.suppress(OSError):
            relay.recv(1)  # only its end comes: at its exit, or its death
        if not done.is_set():
            os.killpg(0, signal.SIGKILL)

    def release(code: int) -> None:
        done.set()
        relay.sendall(json.dumps({"code": code}).encode() + b"\n")
        if watcher.is_alive():
            watcher.join(RELAY_EXIT_S)
        deadline = time.monotonic() + RELAY_EXIT_S
        while time.monotonic() < deadline:  # until Hydra has reaped it, not only closed
            try:
                os.kill(int(req["relay"]), 0)
            except ProcessLookupError:
                return
            time.sleep(0.001)

    from ..training import worker  # imported by the host already (warm_ranks)

    watcher = threading.Thread(target=watch, name="relay", daemon=True)
    code = 1
    try:
        os.setsid()
        relay.setblocking(True)
        relay.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
        watcher.start()
        _become(req, base, _strings(req.get("env")) | _strings(req.get("pmi")))
        from mpi4py import MPI

        MPI.Init()
        argv = [str(a) for a in req["argv"]]
        sys.argv = [worker.__file__, *argv]
        code = worker.exit_code(worker.main, argv, started_at=float(req["at"]))
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc()
    worker.exit_now(code, release)


def _kill_leftovers() -> None:
    """KILL what an app left in this worker's process group (its subprocesses), as the agent
    does to an app's group when its process ends; this worker stays for the next app."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) == me:  # its process group is ours
                os.kill(int(entry), signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:  # no zombies of ours
            pass


def _worker(sock: socket.socket, inherited: list[int]) -> NoReturn:
    """A forked worker: in a session of its own, it runs the apps the host sends it, one at a
    time, answering each with its exit code; it ends when the host closes its socket."""
    code = 126
    try:
        os.setsid()
        for fd in inherited:
            with contextlib.suppress(OSError):
                os.close(fd)
        base = _Baseline()
        sock.setblocking(True)
        reader = sock.makefile("rb")
        sock.sendall(b"{}\n")  # in its own session: a signal to its group reaches it now
        for line in reader:
            code = _run_app(json.loads(line), base)
            _kill_leftovers()
            sock.sendall(json.dumps({"code": code}).encode() + b"\n")
        code = 0
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


@dataclass
class _Worker:
    pid: int
    sock: socket.socket  # the host's end
    key: str | None = None  # the app it runs; None: idle
    buf: bytes = b""


class _Host:
    def __init__(self, sock: socket.socket, parent: int, ranks: bool = False) -> None:
        self.sock, self.parent = sock, parent
        self.rank_host = ranks  # forks fragment ranks, not plain apps
        self.workers: dict[int, _Worker] = {}  # pid → worker (plain apps)
        self.ranks: set[int] = set()  # pids of forked ranks, until reaped
        self.relays: collections.deque[int] = collections.deque()  # fds received, in order
        self.wake_r, self.wake_w = os.pipe()

    def send(self, msg: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(msg).encode() + b"\n")

    def _spawn(self) -> _Worker:
        sys.stdout.flush()
        sys.stderr.flush()
        mine, theirs = socket.socketpair()
        others = [w.sock.fileno() for w in self.workers.values()]
        pid = os.fork()
        if pid == 0:  # the child
            mine.close()
            _worker(theirs, [self.sock.fileno(), self.wake_r, self.wake_w, *others])
        theirs.close()
        mine.settimeout(30.0)
        if mine.recv(3) != b"{}\n":  # it called setsid, or died
            mine.close()
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            raise OSError("a warm worker died before it was ready")
        mine.setblocking(False)
        worker = self.workers[pid] = _Worker(pid, mine)
        return worker

    def fork_rank(self, req: dict[str, Any]) -> None:
        """Fork the rank of ``req`` with the next relay connection received (:func:`_rank`).
        Nothing is answered: the rank's signals and exit go through its relay's ``mpiexec``."""
        if not self.relays:  # the agent always sends one: a request without it is lost
            print("warmhost: a rank request came without its relay", file=sys.stderr)
            return
        fd = self.relays.popleft()
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as exc:
            print(f"warmhost: rank not forked: {exc}", file=sys.stderr, flush=True)
            os.close(fd)  # the relay sees its end: the rank is lost, and mpiexec says so
            return
        if pid == 0:  # the child
            for other in (self.sock.fileno(), self.wake_r, self.wake_w, *self.relays):
                with contextlib.suppress(OSError):
                    os.close(other)
            _rank(req, _Baseline(), socket.socket(fileno=fd))
        os.close(fd)  # the rank's now: its relay ends with it
        self.ranks.add(pid)

    def run(self, req: dict[str, Any]) -> None:
        """Hand the app to an idle worker (forking one if none is), as :func:`_worker` runs it."""
        key = str(req["key"])
        idle = [w for w in self.workers.values() if w.key is None]
        try:
            worker = idle[0] if idle else self._spawn()
        except OSError:
            self.send({"key": key, "code": 126})
            return
        worker.key = key
        worker.sock.setblocking(True)
        with contextlib.suppress(OSError):  # it died just now: the reap reports the app's end
            worker.sock.sendall(json.dumps(req).encode() + b"\n")
        worker.sock.setblocking(False)
        self.send({"key": key, "pid": worker.pid})

    def answers(self, worker: _Worker) -> None:
        """An app's exit code from its worker, which is idle again."""
        try:
            data = worker.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # it is ending: the reap says how
            worker.sock.close()
            return
        worker.buf += data
        while b"\n" in worker.buf:
            line, worker.buf = worker.buf.split(b"\n", 1)
            if worker.key is not None:  # alive: its group is clean, and it stays
                code = int(json.loads(line)["code"])
                self.send({"key": worker.key, "code": code, "alive": True})
                worker.key = None

    def reap(self) -> None:
        while self.workers or self.ranks:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.ranks:
                self.ranks.discard(pid)
                continue
            worker = self.workers.pop(pid, None)
            if worker is None:
                continue
            with contextlib.suppress(OSError):
                worker.sock.close()
            if worker.key is not None:  # it died running an app: that app's end
                self.send({"key": worker.key, "code": os.waitstatus_to_exitcode(status)})

    def finish_ranks(self) -> None:
        """Reap the ranks still ending (within :data:`RELAY_EXIT_S`): a host that is closed
        leaves no zombies for an init that may not reap them."""
        deadline = time.monotonic() + RELAY_EXIT_S
        while self.ranks and time.monotonic() < deadline:
            for pid in list(self.ranks):
                with contextlib.suppress(ChildProcessError):
                    if os.waitpid(pid, os.WNOHANG)[0] == 0:
                        continue
                self.ranks.discard(pid)
            time.sleep(0.01)

    def serve(self) -> int:
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the select
        for sig in IGNORED:
            signal.signal(sig, signal.SIG_IGN)
        buf = b""
        try:
            while os.getppid() == self.parent:
                live = {w.sock: w for w in self.workers.values() if w.sock.fileno() >= 0}
                ready, _, _ = select.select([self.sock, self.wake_r, *live], [], [], 1.0)
                if self.wake_r in ready:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 4096)
                for sock in ready:
                    if sock in live:
                        self.answers(live[sock])
                if self.sock in ready:
                    # A rank's request comes with its relay's connection (SCM_RIGHTS), at or
                    # before the request's first byte: fds queue up in the requests' order.
                    data, fds, _, _ = socket.recv_fds(self.sock, 65536, 64)
                    self.relays.extend(fds)
                    if not data:
                        self.finish_ranks()
                        return 0  # the agent closed its end, or died
                    buf += data
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        req = json.loads(line)
                        self.fork_rank(req) if self.rank_host else self.run(req)
                self.reap()
            return 0
        except (BrokenPipeError, ConnectionResetError):
            return 0
        finally:
            # Forked ranks live on: each is its relay's mpiexec job, which the agent signals
            # and reaps (and KILLs when it leaves); a host that dies costs no training.
            for pid in self.workers:  # the agent is gone: so is their work
                killpg(pid, signal.SIGKILL)


class WarmProc:
    """A plain app in a worker of the warm host: ``pid`` (its group) once the host told it; None
    again once it is done and its worker lives on (the group is the next app's)."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.returncode: int | None = None
        self.pending: list[int] = []  # signals asked for before the pid came

    def poll(self) -> int | None:
        return self.returncode


class WarmHost:
    """The agent's end of a warm host: the process, its socket, the apps it forked.

    Parameters
    ----------
    ranks : bool
        A rank host (``--ranks``), which forks fragment ranks (:meth:`fork_rank`) rather than
        plain apps (:meth:`launch`).
    """

    def __init__(self, ranks: bool = False) -> None:
        ours, theirs = socket.socketpair()
        argv = [sys.executable, "-m", MODULE, str(theirs.fileno())]
        try:
            self.proc = subprocess.Popen(
                [*argv, "--ranks"] if ranks else argv,
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a ^C or the job's TERM to our group is ours to handle
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self.sock = ours
        self.apps: dict[str, WarmProc] = {}
        self.forked = False  # it has served an app: worth replacing if it dies
        self.ready = False  # it has done its imports
        self._buf = b""

    def fileno(self) -> int:
        return self.sock.fileno()

    def launch(self, key: str, request: dict[str, Any]) -> WarmProc:
        """Have it fork plain app ``key``; raises OSError if it is gone (the caller falls back)."""
        self._send({"key": key, **request})
        self.apps[key] = proc = WarmProc()
        return proc

    def fork_rank(self, request: dict[str, Any], relay: int) -> None:
        """Have a rank host fork the rank of ``request`` for the relay connected on fd
        ``relay`` (sent along, :mod:`parsl_bf.pilot.relay`); raises OSError if the host is
        gone. The rank's signals and exit go through its relay's ``mpiexec``, so it is not
        tracked here."""
        self._send(request, relay)
        self.forked = True

    def _send(self, msg: dict[str, Any], fd: int | None = None) -> None:
        data = json.dumps(msg).encode() + b"\n"
        self.sock.setblocking(True)
        try:
            if fd is not None:  # the fd goes with the first byte; the rest follows
                sent = socket.send_fds(self.sock, [data], [fd])
                data = data[sent:]
            self.sock.sendall(data)
        finally:
            self.sock.setblocking(False)

    def read(self) -> bool:
        """Take in what the host said; ``False`` once it is gone."""
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not data:
                return False
            self._buf += data
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                msg = json.loads(line)
                if "ready" in msg:
                    self.ready = True
                    continue
                proc = self.apps.get(str(msg.get("key")))
                if proc is None:
                    continue
                if "pid" in msg:
                    self.forked = True
                    proc.pid = int(msg["pid"])
                    for sig in proc.pending:
                        killpg(proc.pid, sig)
                    proc.pending.clear()
                if "code" in msg:
                    if msg.get("alive"):  # a worker that runs the next app: not its group
                        proc.pid = None
                    proc.returncode = int(msg["code"])
                    del self.apps[str(msg["key"])]

    def lost(self) -> int:
        """The host is gone: KILL what it had, mark it exited with -9; the host's exit code."""
        for proc in self.apps.values():
            if proc.pid is not None:
                killpg(proc.pid, signal.SIGKILL)
            proc.returncode = -signal.SIGKILL
        self.apps.clear()
        self.sock.close()
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        return self.proc.wait()

    def close(self) -> None:
        """Close its socket: the host exits (KILLing the groups of any apps it still has). One
        that has not forked yet may still be importing and not see it: it is KILLed."""
        self.sock.close()
        try:
            self.proc.wait(RELAY_EXIT_S + 1 if self.forked else 0.2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def serve(fd: int, parent: int | None = None, ranks: bool = False) -> int:
    """Serve the agent on socket ``fd`` until it closes (a rank host with ``ranks``, once warm:
    :func:`warm_ranks`); returns the exit code."""
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    if ranks:
        warm_ranks()
    else:
        from . import runner  # noqa: F401  (what every plain app imports)
    try:
        sock.sendall(json.dumps({"ready": os.getpid()}).encode() + b"\n")
    except OSError:  # closed while we warmed up: nothing to serve
        return 0
    return _Host(sock, os.getppid() if parent is None else parent, ranks).serve()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2) or not args[0].isdigit() or args[1:] not in ([], ["--ranks"]):
        print(f"usage: python -m {MODULE} FD [--ranks]", file=sys.stderr)
        return 2
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # it died before the prctl took
        return 0
    return serve(int(args[0]), parent, ranks=args[1:] == ["--ranks"])


if __name__ == "__main__":
    from parsl_bf.pilot.warmhost import main as _main  # the importable module, not __main__

    sys.exit(_main())
