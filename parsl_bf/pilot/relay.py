"""A rank relay: the MPI job of one rank that the agent's warm host forks, not starts.

    mpiexec -pmi-port -n 1 python -I -S .../parsl_bf/pilot/relay.py --connect SOCKET --token N

On a CPU node a fragment's rank is forked from the pilot's rank host
(:mod:`parsl_bf.pilot.warmhost` with ``--ranks``), which imported torch and the trainer once,
so that a start costs no interpreter, imports or first optimizer step. MPICH still needs each
rank to be an ``mpiexec`` job of its own (ranks of different jobs join through
:mod:`.rendezvous`; singletons cannot, MPICH gives them one world id). This process is that
job: started ahead of need, it costs a bare interpreter (``-I -S``: the standard library only)
and says ``ready`` on the agent's Unix socket with its pid, its token and the process-manager
address Hydra gave it (``PMI_PORT``, ``PMI_ID``, ...: :data:`PMI_PREFIXES`). The forked rank
initialises MPI with that address, as the job's rank.

The agent passes this connection to the host, which gives it to the rank it forks. The rank
says its pid (``{"pid": N}``); this process forwards it the signals of a preemption
(:data:`FORWARDED`: Hydra forwards those of ``mpiexec`` here, as to any job's process). Once
it has finalised MPI the rank sends its exit code (``{"code": N}``) and this process exits
with it, so that ``mpiexec`` exits with the rank's code; the rank exits only once this process
is gone, since Hydra KILLs a job's process still running when its rank's connection to Hydra
closes. If the connection ends without a code (a rank killed, a host that died before it
forked, an agent that closed its pool) this process KILLs itself: the rank is lost, and
``mpiexec`` says so. The rank, in turn, KILLs its process group when this process dies before
it has sent its code (a KILL to ``mpiexec``'s job reaches the rank that way).
"""

import contextlib
import json
import os
import signal
import socket
import sys

#: Signals forwarded to the rank (Hydra forwards a preemption's to this process, not the rank).
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
#: The environment Hydra gives its job's process that a forked rank takes as its own.
PMI_PREFIXES = ("PMI_", "MPI_", "MPIR_", "HYDRA_", "HYD_")


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] != "--connect" or argv[2] != "--token":
        print("usage: relay.py --connect SOCKET --token N", file=sys.stderr)
        return 2
    rank = {"pid": 0, "pending": []}

    def forward(signum: int, frame: object) -> None:
        if not rank["pid"]:
            rank["pending"].append(signum)
            return
        with contextlib.suppress(ProcessLookupError):  # it is ending: its code comes next
            os.kill(rank["pid"], signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    env = {k: v for k, v in os.environ.items() if k.startswith(PMI_PREFIXES)}
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(argv[1])
    said = {"ready": os.getpid(), "token": int(argv[3]), "pmi": env}
    sock.sendall(json.dumps(said).encode() + b"\n")
    lines = sock.makefile("rb")
    while True:
        try:
            msg = json.loads(lines.readline(4096))
            if "code" in msg:
                return int(msg["code"])
            rank["pid"] = int(msg["pid"])
        except (ValueError, KeyError, TypeError):
            os.kill(os.getpid(), signal.SIGKILL)  # no word from the rank: it is lost
        for signum in rank["pending"]:
            os.kill(rank["pid"], signum)
        rank["pending"].clear()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
