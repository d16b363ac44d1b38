"""Gradient exchange speed: the trainer's flat-buffer Allreduce against raw mpi4py, per-parameter
calls and torch.distributed with gloo, at 2 and 4 ranks on this machine.

"raw" is one mpi4py Allreduce of one numpy buffer of the same size; "flat" is the trainer's
exchange (the same buffer bound to the model's .grad, reduced in 4 MB buckets).

Two gradients: 25.5 M float32 (ResNet-50-sized, as 161 tensors of ResNet-50's shapes' sizes)
and ResNet-18's own (11.7 M in 62 tensors). Bus bandwidth = 2(n−1)/n · bytes / time. The
driver runs itself under mpiexec per world size, prints a table, and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPEATS = 7


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


def rank_main(repeats: int) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    from parsl_bf.training.examples import ResNet18
    from parsl_bf.training.exchange import FlatGradients, allreduce_per_parameter

    comm = MPI.COMM_WORLD
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
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank:
        rank_main(args.repeats)
        return 0
    if args.quick:
        args.worlds, args.repeats = "2", 2
    mpiexec = str(Path(sys.executable).with_name("mpiexec"))
    root = Path(__file__).resolve().parents[1]
    results = {}
    for i, world in enumerate(int(w) for w in args.worlds.split(",")):
        env = {**os.environ, "MASTER_PORT": str(29500 + i), "PYTHONPATH": str(root)}
        proc = subprocess.run(
            [mpiexec, "-n", str(world), sys.executable, __file__, "--rank"]
            + ["--repeats", str(args.repeats)],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
        )
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not line:
            print(proc.stderr, file=sys.stderr)
            return 1
        results[world] = json.loads(line[0][7:])

    def gbps(world, case, method):
        r = results[world][case]
        return 2 * (world - 1) / world * 4 * r["floats"] / r[method] / 1e9

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
    figures["resnet18_ratio_vs_raw"] = {
        w: round(results[w]["resnet18"]["raw"] / results[w]["resnet18"]["flat"], 3) for w in results
    }
    # A time that is not positive, or a bus bandwidth past any memory's, cannot be measured.
    anomalies = [
        f"{world} ranks, {case}, {m}: {r[m]} s"
        for world, cases in results.items()
        for case, r in cases.items()
        for m in ("raw", "flat", "per_param", "gloo")
        if not r[m] > 0 or gbps(world, case, m) > 1000
    ]
    figures |= {"repeats": args.repeats, "quick": args.quick, "anomalies": anomalies}
    print(json.dumps(figures))
    return 1 if anomalies else 0


if __name__ == "__main__":
    sys.exit(main())
