"""Gradient exchange speed: the trainer's flat-buffer Allreduce against raw mpi4py, per-parameter
calls and torch.distributed with gloo, at 2 and 4 ranks on this machine.

"raw" is one mpi4py Allreduce of one numpy buffer of the same size; "flat" is the trainer's
exchange (the same buffer bound to the model's .grad, reduced in 4 MB buckets).

``--hosts H`` (root): the same, also with one rank on each of H separate hosts (the loopback
cluster's network namespaces, brought up and down here), so the bytes cross TCP between
hosts: one ``mpiexec`` per host joined by :mod:`parsl_bf.training.rendezvous`, as a fragment
spanning pilots is. The single-host worlds run in the same invocation as the baseline. JSON:
``ratio_vs_raw_hosts<H>`` (raw ÷ flat time over the hosts) and ``hosts``.

Two gradients: 25.5 M float32 (ResNet-50-sized, as 161 tensors of ResNet-50's shapes' sizes)
and ResNet-18's own (11.7 M in 62 tensors). Bus bandwidth = 2(n−1)/n · bytes / time. The
driver runs itself under mpiexec per world size, prints a table, and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _hosts import host_command, separate_hosts  # benchmarks/, beside this script

REPEATS = 7
METHODS = ("raw", "flat", "per_param", "gloo")
ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = str(Path(sys.executable).with_name("mpiexec"))
# --hosts: the loopback cluster's separate hosts, on ports (and so a net, 10.213.207) apart
# from the tests' and the other benchmarks'.
HOSTS_DIR = Path(tempfile.gettempdir()) / "bench-allreduce-hosts"
HOSTS_PORTS = {"ctld_port": 18957, "base_port": 28200}


def across_hosts(count: int, rank: list[str], env: dict[str, str]) -> dict | None:
    """One rank on each host (``n1`` … ``n<count>``), each its own ``mpiexec`` on its host,
    joined into one world by the rendezvous; group 0's result, None if a group failed."""
    with tempfile.TemporaryDirectory(prefix="bench-allreduce-rdv-") as rdv:
        # gloo's rendezvous on host n1 (a name the hosts' /etc/hosts resolve), over eth0.
        env = {**env, "MASTER_ADDR": "n1", "MASTER_PORT": "29600", "GLOO_SOCKET_IFNAME": "eth0",
               "PYTHONPATH": str(ROOT)}  # fmt: skip
        procs = [
            subprocess.Popen(
                [
                    *shlex.split(host_command(env).replace("{host}", f"n{g + 1}")),
                    MPIEXEC,
                    "-launcher",
                    "fork",
                    "-n",
                    "1",
                    *rank,
                    "--rendezvous",
                    rdv,
                    "--group",
                    str(g),
                    "--groups",
                    str(count),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )  # fmt: skip
            for g in range(count)
        ]
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=900))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise SystemExit(f"ranks across {count} hosts: no result in 900 s") from None
    line = [x for x in outs[0][0].splitlines() if x.startswith("RESULT ")]
    if any(p.returncode for p in procs) or not line:
        for g, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)):
            print(f"host n{g + 1}: exit {p.returncode}\n{err}", file=sys.stderr)
        return None
    return json.loads(line[0][7:])


def _resnet50_like_sizes() -> list[int]:
    """161 tensor sizes summing to 25.5 M: ResNet-50's conv/bn/fc pattern, approximately."""
    sizes = [9408, 64, 64]
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            cin = width * 4 if b else width * 2 if width > 64 else 64
            sizes += [
                cin * width,
                width,
                width,
                9 * width * width,
                width,
                width,
                width * width * 4,
                width * 4,
                width * 4,
            ]
    sizes += [2048 * 1000, 1000]
    scale = 25_557_032 / sum(sizes)
    return [max(1, int(s * scale)) for s in sizes]


def rank_main(repeats: int, rendezvous: str | None, group: int, groups: int) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    from parsl_bf.training.examples import ResNet18
    from parsl_bf.training.exchange import FlatGradients, allreduce_per_parameter
    from parsl_bf.training.rendezvous import join

    # One world, whether one mpiexec started every rank or one per host did.
    comm = MPI.COMM_WORLD if rendezvous is None else join(rendezvous, group, groups, 120.0)
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", rank=comm.rank, world_size=comm.size)
    cases = {
        "resnet50-sized": [torch.nn.Parameter(torch.zeros(n)) for n in _resnet50_like_sizes()],
        "resnet18": list(ResNet18().parameters()),
    }
    out = {}
    for name, params in cases.items():
        flat = FlatGradients(params)
        for p in params:
            p.grad.normal_()
        raw = np.ones(flat.buffer.numel(), dtype=np.float32)
        methods = {
            "raw": lambda raw=raw: comm.Allreduce(MPI.IN_PLACE, raw, op=MPI.SUM),
            "flat": lambda flat=flat: flat.allreduce(comm),
            "per_param": lambda params=params: allreduce_per_parameter(params, comm),
            "gloo": lambda flat=flat: dist.all_reduce(flat.buffer),
        }
        times = {m: [] for m in methods}
        for fn in methods.values():
            fn()  # warm-up
        for _ in range(repeats):  # interleaved, so drifts hit every method alike
            for m, fn in methods.items():
                comm.Barrier()
                t0 = time.perf_counter()
                fn()
                times[m].append(time.perf_counter() - t0)
        out[name] = {"floats": int(flat.buffer.numel()), "tensors": len(params)}
        for m, ts in times.items():
            out[name][m] = comm.allreduce(statistics.median(ts), op=MPI.MAX)
    dist.destroy_process_group()
    if comm.rank == 0:
        print("RESULT " + json.dumps(out), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--repeats", type=int, default=REPEATS, help=f"per method (default {REPEATS})")
    ap.add_argument("--quick", action="store_true", help="world 2 only, 2 repeats")
    ap.add_argument(
        "--hosts",
        type=int,
        default=0,
        help="also one rank on each of this many separate hosts (root; at least 2)",
    )
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rendezvous", help=argparse.SUPPRESS)
    ap.add_argument("--group", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--groups", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank:
        from parsl_bf.training.worker import exit_now

        rank_main(args.repeats, args.rendezvous, args.group, args.groups)
        # As the trainer's ranks end: MPI_Finalize, then no interpreter teardown (which, after a
        # rendezvous across hosts, crashes in MPICH's cleanup of the connected worlds).
        exit_now(0)
    if args.hosts == 1 or args.hosts < 0:
        ap.error("--hosts: at least 2 (0: this machine only)")
    if args.quick:
        args.worlds, args.repeats = "2", 2
    rank = [sys.executable, __file__, "--rank", "--repeats", str(args.repeats)]
    results: dict[int | str, dict] = {}
    for i, world in enumerate(int(w) for w in args.worlds.split(",")):
        env = {**os.environ, "MASTER_PORT": str(29500 + i), "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(
            [MPIEXEC, "-n", str(world), *rank], capture_output=True, text=True, env=env,
            timeout=900,
        )  # fmt: skip
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not line:
            print(proc.stderr, file=sys.stderr)
            return 1
        results[world] = json.loads(line[0][7:])
    if args.hosts:
        with separate_hosts(args.hosts, HOSTS_DIR, HOSTS_PORTS) as env:
            out = across_hosts(args.hosts, rank, env)
        if out is None:
            return 1
        results[f"hosts{args.hosts}"] = out

    def ranks(world: int | str) -> int:
        return args.hosts if world == f"hosts{args.hosts}" else int(world)

    def gbps(world, case, method):
        r, n = results[world][case], ranks(world)
        return 2 * (n - 1) / n * 4 * r["floats"] / r[method] / 1e9

    print(
        f"{'ranks':>5} {'gradient':>15} {'floats':>11} {'raw ms':>8} {'flat ms':>8} "
        f"{'per-param ms':>12} {'gloo ms':>8} {'flat/raw':>8} {'raw GB/s':>8}"
    )
    for world, cases in results.items():
        for case, r in cases.items():
            print(
                f"{world:>5} {case:>15} {r['floats']:>11,} {1e3 * r['raw']:>8.1f} "
                f"{1e3 * r['flat']:>8.1f} {1e3 * r['per_param']:>12.1f} {1e3 * r['gloo']:>8.1f} "
                f"{r['raw'] / r['flat']:>8.2f} {gbps(world, case, 'raw'):>8.2f}"
            )
    big = "resnet50-sized"
    figures = {
        f"ratio_vs_raw_{w}": round(results[w][big]["raw"] / results[w][big]["flat"], 3)
        for w in results
    }
    if 2 in results:
        figures.update({f"gbps_{m}_2": round(gbps(2, big, m), 3) for m in ("raw", "flat", "gloo")})
        figures["gbps_per_param_2"] = round(gbps(2, big, "per_param"), 3)
    if args.hosts:
        over = f"hosts{args.hosts}"
        figures.update({f"gbps_{m}_{over}": round(gbps(over, big, m), 3) for m in METHODS})
    figures["resnet18_ratio_vs_raw"] = {
        w: round(results[w]["resnet18"]["raw"] / results[w]["resnet18"]["flat"], 3) for w in results
    }
    # A time that is not positive, or a bus bandwidth past any memory's, cannot be measured.
    anomalies = [
        f"{world} ranks, {case}, {m}: {r[m]} s"
        for world, cases in results.items()
        for case, r in cases.items()
        for m in METHODS
        if not r[m] > 0 or gbps(world, case, m) > 1000
    ]
    figures |= {"hosts": args.hosts or 1, "repeats": args.repeats, "quick": args.quick}
    figures["anomalies"] = anomalies
    print(json.dumps(figures))
    return 1 if anomalies else 0


if __name__ == "__main__":
    sys.exit(main())
