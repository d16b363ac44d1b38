"""The warm host: runs plain apps in workers forked once from a process that has imported the
runner already.

``python -m parsl_bf.executor.warmhost FD``, started by the agent (one per pilot, with its first
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
``stderr`` (appending), runs :func:`parsl_bf.executor.runner.main` on ``[src, out]``, runs the
app's ``atexit`` handlers, and KILLs what the app left in its process group. The host answers
``{key, pid}`` once a worker has the app and ``{key, code, alive: true}`` when it is done, or
``{key, code}`` (negative: killed by that signal, as :attr:`subprocess.Popen.returncode` says)
when the worker died with it, in that order per key.

The host never outlives the agent: the kernel KILLs it when the agent dies (Linux's
``PR_SET_PDEATHSIG``), and it exits when its socket closes or its parent changes, KILLing
the process groups of its workers; an idle worker ends when the host's end of its socket
closes. It ignores the signals that mean a preemption (the agent forwards those to each app's
group itself).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import sys
import threading
import traceback
from dataclasses import dataclass
from typing import Any, NoReturn

from . import runner

__all__ = ["main", "serve"]

#: Signals the agent handles (a preemption); the host leaves them to it.
IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
PR_SET_PDEATHSIG = 1


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


def _run_app(req: dict[str, Any], base: _Baseline) -> int:
    """In a worker: set up as the app's process would be, run the app; its exit code."""
    signal.set_wakeup_fd(-1)
    for sig in (*IGNORED, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh interpreter
    atexit._clear()  # the host's (or the last app's) exit handlers are not this app's
    if req.get("cwd"):
        os.chdir(req["cwd"])
    env = {str(k): str(v) for k, v in (req.get("env") or {}).items()}
    os.environ.clear()
    os.environ.update(base.environ)
    os.environ.update(env)
    # What a fresh `python -m` would have on sys.path: the cwd first, then PYTHONPATH.
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *extra, *(p for p in base.path[1:] if p not in extra)]
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    for fd, path in ((1, req.get("stdout")), (2, req.get("stderr"))):
        f = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666) if path else null
        os.dup2(f, fd)
        if f != null:
            os.close(f)
    os.close(null)
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
    def __init__(self, sock: socket.socket, parent: int) -> None:
        self.sock, self.parent = sock, parent
        self.workers: dict[int, _Worker] = {}  # pid → worker
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
        while self.workers:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            worker = self.workers.pop(pid, None)
            if worker is None:
                continue
            with contextlib.suppress(OSError):
                worker.sock.close()
            if worker.key is not None:  # it died running an app: that app's end
                self.send({"key": worker.key, "code": os.waitstatus_to_exitcode(status)})

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
                    data = self.sock.recv(65536)
                    if not data:
                        return 0  # the agent closed its end, or died
                    buf += data
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        self.run(json.loads(line))
                self.reap()
            return 0
        except (BrokenPipeError, ConnectionResetError):
            return 0
        finally:
            for pid in self.workers:  # the agent is gone: so is their work
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)


def serve(fd: int, parent: int | None = None) -> int:
    """Serve the agent on socket ``fd`` until it closes; returns the exit code."""
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    return _Host(sock, os.getppid() if parent is None else parent).serve()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        print("usage: python -m parsl_bf.executor.warmhost FD", file=sys.stderr)
        return 2
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # it died before the prctl took
        return 0
    return serve(int(args[0]), parent)


if __name__ == "__main__":
    from parsl_bf.executor.warmhost import main as _main  # the importable module, not __main__

    sys.exit(_main())
