"""Ranks forked from a warm host against ranks started cold: the MPI side of a fork design.

A fragment start on a CPU node costs one warm-up of its standby (torch, the first optimizer
step): about 1.7 s here, whether it runs before the start or beside the rank before it. Ranks
forked from a host that stays warm would not pay it. This benchmark measures that path with
the project's own rendezvous (``parsl_bf.training.rendezvous``), nothing else of the executor:

* **cold** (the baseline): each of ``--ranks`` groups is ``mpiexec -n 1 python`` that imports
  torch, initialises MPI and joins the others;
* **fork**: a host process, not under ``mpiexec``, has imported torch and mpi4py without
  initialising MPI and done one optimizer step. Each group is ``mpiexec -pmi-port -n 1`` of a
  relay (this file in ``--relay`` mode, standard library only) that hands its ``PMI_PORT`` and
  ``PMI_ID`` to the host over a Unix socket; the host forks a child with them, which
  initialises MPI (its own world, as a standby's is) and joins.

Figure: launch of all groups → every rank has joined and done an allreduce, median over
``--repeats``. What the relay protocol must respect (found by this probe, with MPICH's Hydra):
the relay must stay alive while its child uses PMI (if it exits first, the child's
``MPI_Init`` is refused), and Hydra kills a relay that is still running when its child's PMI
connection closes before it has reaped the relay. So the child tells the relay its exit code
and exits only once the relay is gone from the process table. MPI singletons (no
``mpiexec``) cannot join each other: MPICH gives them the same world id.

The host here probes the MPI side only; the executor's ranks are forked this way by the
agent's rank host (``parsl_bf.pilot.warmhost --ranks``) for relays
(``parsl_bf.pilot.relay``), and ``benchmarks/rescale.py --mode ranks-fork`` measures those
ranks' starts and rescales end to end.

    .venv/bin/python benchmarks/warm_fork.py                 # 2 ranks, 5 repeats, ~1 min
    .venv/bin/python benchmarks/warm_fork.py --ranks 4 --repeats 3
"""

from __future__ import annotations

import argparse
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

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))
PMI_KEYS = ("PMI_PORT", "PMI_ID", "PMI_HOSTNAME", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")


def _rank(rdv: str, group: int, groups: int, done: str) -> None:
    """One rank, MPI not yet initialised: init, join the others, allreduce, mark ``done``."""
    from mpi4py import MPI

    from parsl_bf.training.rendezvous import join

    if not MPI.Is_initialized():  # a cold rank initialised it on import
        MPI.Init()
    comm = join(rdv, group, groups)
    total = comm.allreduce(1)
    with open(done, "w") as f:
        f.write(f"{time.time()} {total}\n")
    comm.Free()


def _warm_imports() -> None:
    import mpi4py

    mpi4py.rc.initialize = False  # each forked child initialises its own MPI world
    mpi4py.rc.finalize = False
    import torch

    torch.set_num_threads(1)  # no OpenMP pool in the host: a forked child could not use it
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.zeros(1, 4)).sum().backward()
    opt.step()  # imports torch._dynamo, as a standby's warm-up does
    sys.path.insert(0, ROOT)
    import parsl_bf.training.rendezvous  # noqa: F401


def host(sock_path: str) -> None:
    """Serve relays: fork a rank with each relay's PMI environment."""
    _warm_imports()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        msg = json.loads(conn.makefile().readline())
        if msg.get("quit"):
            return
        if os.fork() == 0:
            listener.close()
            os.setsid()
            os.environ.update(msg["env"])
            code = 0
            try:
                _rank(msg["rdv"], msg["group"], msg["groups"], msg["done"])
            except BaseException as exc:  # the relay reports it: keep the order below
                print(f"rank failed: {exc!r}", file=sys.stderr, flush=True)
                code = 1
            # The relay exits first: Hydra kills a relay whose rank's PMI connection closed.
            conn.sendall(f"{code}\n".encode())
            conn.recv(1)  # EOF: the relay is exiting
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:  # until Hydra has reaped it (no zombie left)
                try:
                    os.kill(msg["pid"], 0)
                except ProcessLookupError:
                    break
                time.sleep(0.001)
            os._exit(code)
        conn.close()
        while True:  # reap the ranks that ended
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break


def relay(sock_path: str, rdv: str, group: int, groups: int, done: str) -> int:
    """Under ``mpiexec -pmi-port``: hand this process's PMI environment to the host, exit
    with the rank's code."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock_path)
    env = {k: os.environ[k] for k in PMI_KEYS if k in os.environ}
    msg = {
        "env": env,
        "pid": os.getpid(),
        "rdv": rdv,
        "group": group,
        "groups": groups,
        "done": done,
    }
    s.sendall((json.dumps(msg) + "\n").encode())
    line = s.makefile().readline()
    return int(line) if line.strip() else 1


def _mpiexec() -> str:
    found = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if not found:
        sys.exit("benchmarks/warm_fork.py: no mpiexec next to this Python or on PATH")
    return found


def _one(mode: str, ranks: int, work: str, sock_path: str) -> float:
    """Launch ``ranks`` groups; seconds until every rank has joined and reduced."""
    rdv = tempfile.mkdtemp(dir=work)
    dones = [os.path.join(rdv, f"done.{g}") for g in range(ranks)]
    t0 = time.time()
    procs = []
    for g in range(ranks):
        if mode == "cold":
            argv = [_mpiexec(), "-n", "1", sys.executable, HERE, "--cold"]
        else:
            argv = [_mpiexec(), "-pmi-port", "-n", "1", sys.executable, "-I", "-S", HERE]
            argv += ["--relay", sock_path]
        argv += ["--rdv", rdv, "--group", str(g), "--groups", str(ranks), "--done", dones[g]]
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL))
    codes = [p.wait(timeout=120) for p in procs]
    if any(codes):
        raise SystemExit(f"benchmarks/warm_fork.py: {mode} ranks exited {codes}")
    ends = []
    for d in dones:
        with open(d) as f:
            stamp, total = f.read().split()
        if int(total) != ranks:
            raise SystemExit(f"benchmarks/warm_fork.py: {mode} allreduce gave {total}")
        ends.append(float(stamp))
    return max(ends) - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="1 repeat")
    ap.add_argument("--host", help=argparse.SUPPRESS)
    ap.add_argument("--relay", help=argparse.SUPPRESS)
    ap.add_argument("--cold", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rdv", help=argparse.SUPPRESS)
    ap.add_argument("--group", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--groups", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--done", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.host:
        return host(a.host)
    if a.relay:
        sys.exit(relay(a.relay, a.rdv, a.group, a.groups, a.done))
    if a.cold:
        sys.path.insert(0, ROOT)
        import torch  # noqa: F401  (what a cold rank pays)

        return _rank(a.rdv, a.group, a.groups, a.done)
    if a.quick:
        a.repeats = 1

    work = tempfile.mkdtemp(prefix="warm-fork-")
    sock_path = os.path.join(work, "host.sock")
    t = time.time()
    hostp = subprocess.Popen([sys.executable, HERE, "--host", sock_path], stdout=subprocess.PIPE)
    try:
        if hostp.stdout.readline().strip() != b"ready":
            raise SystemExit("benchmarks/warm_fork.py: the host did not start")
        host_warm = time.time() - t
        rows = {"cold": [], "fork": []}
        for i in range(a.repeats):
            for mode in ("cold", "fork"):  # interleaved: both see the same machine
                rows[mode].append(_one(mode, a.ranks, work, sock_path))
                print(f"  repeat {i + 1}/{a.repeats} {mode}: {rows[mode][-1]:.3f} s", flush=True)
    finally:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(sock_path)
                s.sendall(b'{"quit": true}\n')
        except OSError:
            hostp.send_signal(signal.SIGKILL)
        hostp.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    med = {m: statistics.median(v) for m, v in rows.items()}
    print(f"\n{a.ranks} ranks, launch -> joined and reduced, {a.repeats} repeats")
    print(f"{'mode':<6} {'median s':>9} {'min s':>7} {'max s':>7}")
    for m, v in rows.items():
        print(f"{m:<6} {med[m]:>9.3f} {min(v):>7.3f} {max(v):>7.3f}")
    ratio = med["fork"] / med["cold"]
    print(f"host warm-up (once per node): {host_warm:.2f} s; fork / cold: {ratio:.3f}")
    out = {"ranks": a.ranks, "repeats": a.repeats, "cold_s": round(med["cold"], 3)}
    out |= {"fork_s": round(med["fork"], 3), "fork_over_cold": round(ratio, 3)}
    out |= {"host_warm_s": round(host_warm, 2), "quick": a.quick}
    # A launch timed at zero or less did not happen as timed.
    out["anomalies"] = [f"{m}: {t} s" for m, v in rows.items() for t in v if not t > 0]
    print(json.dumps(out))
    if out["anomalies"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
