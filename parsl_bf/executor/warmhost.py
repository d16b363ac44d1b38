"""The warm host: forks plain apps from one process that has imported the runner already.

``python -m parsl_bf.executor.warmhost FD``, started by the agent (one per pilot), ``FD`` its
end of a Unix socket pair. Starting a Python that imports Parsl and unpacks the app costs about
a second per plain app; the host pays it once, as HTEX's worker pool does, and forks a child
per app, as :mod:`multiprocessing`'s forkserver does. It stays single-threaded (no ZeroMQ in
it) so that forking is safe.

The agent sends one JSON line per app, ``{key, src, out, env, cwd, stdout, stderr}``. The
host forks a child that starts a session of its own (its own process group, as the agent's
subprocesses have: the agent signals the group by the child's pid), changes to ``cwd``, adds
``env`` to its environment (``PYTHONPATH`` entries to ``sys.path`` too, as a fresh interpreter
would have them), points fds 0, 1, 2 at ``/dev/null``, ``stdout`` and ``stderr`` (appending),
runs :func:`parsl_bf.executor.runner.main` on ``[src, out]`` and exits with its code. The host
answers ``{key, pid}`` once the child is in its own session (so a signal to that group reaches
it) and ``{key, code}`` when it reaps it (negative: killed by that signal, as
:attr:`subprocess.Popen.returncode` says), in that order per key.

The host never outlives the agent: the kernel KILLs it when the agent dies (Linux's
``PR_SET_PDEATHSIG``), and it exits when its socket closes or its parent changes, KILLing
the process groups of the children it still has. It ignores the signals that mean a
preemption (the agent forwards those to each app's group itself).
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
from typing import Any

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


def _child(req: dict[str, Any], inherited: list[int]) -> int:
    """In the forked child: become the app's process and run it; returns the exit code."""
    signal.set_wakeup_fd(-1)
    for sig in (*IGNORED, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh interpreter
    for fd in inherited:
        os.close(fd)
    atexit._clear()  # the host's exit handlers are not the app's
    if req.get("cwd"):
        os.chdir(req["cwd"])
    env = {str(k): str(v) for k, v in (req.get("env") or {}).items()}
    os.environ.update(env)
    # What a fresh `python -m` would have on sys.path: the cwd first, then PYTHONPATH.
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *extra, *(p for p in sys.path[1:] if p not in extra)]
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
    return code


class _Host:
    def __init__(self, sock: socket.socket, parent: int) -> None:
        self.sock, self.parent = sock, parent
        self.children: dict[int, str] = {}  # pid → key
        self.wake_r, self.wake_w = os.pipe()

    def send(self, msg: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(msg).encode() + b"\n")

    def fork(self, req: dict[str, Any]) -> None:
        key = str(req["key"])
        sys.stdout.flush()
        sys.stderr.flush()
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            code = 126
            try:
                os.setsid()
                os.close(ready_w)  # the host reads EOF: we are in our own session
                os.close(ready_r)
                code = _child(req, [self.sock.fileno(), self.wake_r, self.wake_w])
            except BaseException:
                with contextlib.suppress(Exception):
                    traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                with contextlib.suppress(Exception):
                    sys.stderr.flush()
                os._exit(code)
        os.close(ready_w)
        os.read(ready_r, 1)  # EOF once the child called setsid (or died)
        os.close(ready_r)
        self.children[pid] = key
        self.send({"key": key, "pid": pid})

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            key = self.children.pop(pid, None)
            if key is not None:
                self.send({"key": key, "code": os.waitstatus_to_exitcode(status)})

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
                ready, _, _ = select.select([self.sock, self.wake_r], [], [], 1.0)
                if self.wake_r in ready:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 4096)
                if self.sock in ready:
                    data = self.sock.recv(65536)
                    if not data:
                        return 0  # the agent closed its end, or died
                    buf += data
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        self.fork(json.loads(line))
                self.reap()
            return 0
        except (BrokenPipeError, ConnectionResetError):
            return 0
        finally:
            for pid in self.children:  # the agent is gone: so is their work
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
