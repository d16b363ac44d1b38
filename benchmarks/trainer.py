"""Training throughput: the elastic trainer against plain PyTorch, same model and data, one run.

- world 1: ``ElasticTrainer`` (``mpiexec -n 1 python -m parsl_bf.training.worker``) against the
  plain single-process loop over a ``DataLoader`` (TensorDataset, shuffled, the same global
  batch); also the plain loop with tensor indexing instead of the DataLoader (as the trainer
  reads its data), which shows what the DataLoader costs and bounds what the trainer can reach.
- world 2: the trainer at 2 ranks against ``DistributedDataParallel`` (gloo, 2 processes, a
  ``DistributedSampler``), the global batch split in two.
- GPU (only where CUDA is available): ResNet-50 in bf16 autocast on synthetic images resident
  on the device, the trainer at world 1 against the plain loop, images/s.

The CPU model is an MLP 784→1024→1024→10 (1.9 M parameters) on 8,192 synthetic 1×28×28 images
with labels from a fixed random linear teacher (seeded, so every side trains on the same data).
Every side runs in a fresh process with ``torch.set_num_threads(cores // ranks)``, as the
trainer's worker sets itself. Start-up is excluded: every side runs ``--warmup`` steps, then the
measured window of ``--samples`` samples, and its samples/s is window samples / window seconds,
from the end of the last warm-up step to the end of the window's last step. The trainer's
window comes from its own progress reports (``rate`` of each ``step`` event, one per 5 steps:
its samples over the seconds since the previous report), the baselines' from a timestamp taken
after each step (after ``loss.item()``, as the trainer syncs its loss every step). The trainer
runs with ``--checkpoint-every`` beyond the run, so no checkpoint is written in the window.
Sides are interleaved (the order reversed every other repeat) and each figure is the median of
``--repeat``; ratios are taken between the medians. A figure that cannot be right (a window
that holds other samples than it should, a world size or thread count other than asked, the
trainer over 1.3x the fastest run of the same loop without the DataLoader, two ranks more
than twice as fast as one process on the same cores, w1 vs plain above 1.5) is listed under
``suspect`` and its ratio is given as null. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from parsl_bf.training.command import mpiexec_argv, worker_argv

ROOT = Path(__file__).resolve().parents[1]
TASKS = {"mlp": "benchmarks.trainer:mlp_task", "resnet50": "benchmarks.trainer:resnet50_task"}
REPORT_EVERY = 5  # ElasticTrainer's report_every (the worker has no option for it)
SIDES = ("plain", "plain_indexed", "elastic_w1", "ddp_w2", "elastic_w2")
LABELS = {
    "plain": "plain loop, DataLoader",
    "plain_indexed": "plain loop, tensor indexing",
    "elastic_w1": "ElasticTrainer, mpiexec -n 1",
    "ddp_w2": "DDP gloo, 2 processes",
    "elastic_w2": "ElasticTrainer, mpiexec -n 2",
}
WORLD = {"plain": 1, "plain_indexed": 1, "elastic_w1": 1, "ddp_w2": 2, "elastic_w2": 2}
W1_VS_PLAIN_MAX = 1.5  # above this, ratio_w1_vs_plain is not believed
# The trainer does at least the indexed loop's work, yet on this 2-core machine it measured
# 1.07-1.20x that loop's fastest run over 6 quiet runs (cause not found; the loop is the
# noisier side): 1.15 flagged 1 run in 3 there. Above 1.3 the figure is not believed.
INDEXED_SLACK = 1.3
TIMEOUT_S = 900  # one side of one measurement


@dataclass
class Workload:
    """What every side trains: factories called in each process, data built once per process."""

    model: Callable[[], nn.Module]
    optimizer: Callable[..., torch.optim.Optimizer]
    inputs: torch.Tensor
    targets: torch.Tensor
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # per-sample losses
    global_batch: int
    seed: int


def _per_sample_ce(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, t, reduction="none")


def mlp_workload(
    samples: int = 8192, global_batch: int = 64, hidden: int = 1024, lr: float = 0.01, seed: int = 0
) -> Workload:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 1, 28, 28, generator=g)
    teacher = torch.randn(28 * 28, 10, generator=g)
    y = (x.flatten(1) @ teacher).argmax(1)

    def model() -> nn.Module:
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(28 * 28, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 10),
        )

    return Workload(
        model=model,
        optimizer=lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9),
        inputs=x,
        targets=y,
        loss=_per_sample_ce,
        global_batch=global_batch,
        seed=seed,
    )


class _Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.skip = nn.Identity()
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.skip(x))


class ResNet50(nn.Module):
    """ResNet-50 (v1.5, stride in the 3×3 convolution), 25.6 M parameters: used when
    torchvision is missing."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(3, 64, 7, 2, 3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        ]
        cin = 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for b in range(blocks):
                layers.append(_Bottleneck(cin, width, stride if b == 0 else 1))
                cin = 4 * width
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


def _resnet50() -> tuple[nn.Module, str]:
    try:
        from torchvision.models import resnet50
    except ImportError:
        return ResNet50(), "ResNet-50 (this file's; torchvision missing)"
    return resnet50(), "torchvision resnet50"


class _Autocast(nn.Module):
    """The model under bf16 autocast; float32 parameters and float32 logits."""

    def __init__(self, net: nn.Module, device: str) -> None:
        super().__init__()
        self.net, self.device_type = net, torch.device(device).type

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(self.device_type, dtype=torch.bfloat16):
            return self.net(x).float()


def resnet50_workload(
    samples: int = 256,
    image: int = 224,
    global_batch: int = 64,
    lr: float = 0.1,
    seed: int = 0,
    device: str = "cuda",
) -> Workload:
    """ResNet-50 on random images kept on ``device`` (no host-to-device copy in the loop)."""
    torch.backends.cudnn.benchmark = True
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(samples, 3, image, image, generator=g, device=device)
    y = torch.randint(0, 1000, (samples,), generator=g, device=device)
    return Workload(
        model=lambda: _Autocast(_resnet50()[0], device).to(device),
        optimizer=lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9),
        inputs=x,
        targets=y,
        loss=_per_sample_ce,
        global_batch=global_batch,
        seed=seed,
    )


WORKLOADS = {"mlp": mlp_workload, "resnet50": resnet50_workload}


def _task(workload: Workload, record: str | None):
    from parsl_bf.training.trainer import TrainingTask

    if record:  # the threads the worker set (it loads the task after setting them)
        rank = os.environ.get("PMI_RANK", "0")
        Path(f"{record}.{rank}").write_text(str(torch.get_num_threads()))
    w = workload
    return TrainingTask(
        model=w.model,
        optimizer=w.optimizer,
        dataset=lambda: (w.inputs, w.targets),
        loss=w.loss,
        global_batch=w.global_batch,
        seed=w.seed,
    )


def mlp_task(record: str | None = None, **options):
    """The MLP workload as a TrainingTask (``--task benchmarks.trainer:mlp_task``)."""
    return _task(mlp_workload(**options), record)


def resnet50_task(record: str | None = None, **options):
    """The ResNet-50 workload as a TrainingTask (``--task benchmarks.trainer:resnet50_task``)."""
    return _task(resnet50_workload(**options), record)


# --- the baselines, each in its own process ----------------------------------------------------


def _timed_steps(step: Callable[[tuple], tuple[int, float]], batches, warmup: int, steps: int):
    """Run warmup + steps steps; (window samples, window seconds, last loss)."""
    ends, sizes, loss = [], [], float("nan")
    for batch in batches:
        n, loss = step(batch)
        ends.append(time.perf_counter())
        sizes.append(n)
        if len(ends) == warmup + steps:
            break
    return sum(sizes[warmup:]), ends[-1] - ends[warmup - 1], loss


def _forever(loader, on_epoch: Callable[[int], None] = lambda epoch: None):
    epoch = 0
    while True:
        on_epoch(epoch)
        yield from loader
        epoch += 1


def plain_side(args) -> dict:
    torch.set_num_threads(args.threads)
    w = WORKLOADS[args.workload](**json.loads(args.options))
    torch.manual_seed(w.seed)  # as the trainer seeds before building the model
    model = w.model()
    optimizer = w.optimizer([p for p in model.parameters() if p.requires_grad])
    if args.loader == "dataloader":
        from torch.utils.data import DataLoader, TensorDataset

        loader = DataLoader(
            TensorDataset(w.inputs, w.targets),
            batch_size=w.global_batch,
            shuffle=True,
            generator=torch.Generator().manual_seed(w.seed),
        )
        batches = _forever(loader)
    else:
        gen = torch.Generator().manual_seed(w.seed)

        def indexed():
            while True:
                for idx in torch.randperm(len(w.inputs), generator=gen).split(w.global_batch):
                    yield w.inputs[idx], w.targets[idx]

        batches = indexed()

    def step(batch):
        x, y = batch
        optimizer.zero_grad()
        loss = w.loss(model(x), y).mean()
        loss.backward()
        optimizer.step()
        return len(x), loss.item()

    samples, seconds, loss = _timed_steps(step, batches, args.warmup, args.steps)
    return {
        "samples": samples,
        "seconds": seconds,
        "loss": loss,
        "threads": torch.get_num_threads(),
    }


def ddp_side(args) -> dict | None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=args.init, rank=args.rank, world_size=args.world)
    w = WORKLOADS[args.workload](**json.loads(args.options))
    torch.manual_seed(w.seed)
    model = DistributedDataParallel(w.model())
    optimizer = w.optimizer(model.parameters())
    data = TensorDataset(w.inputs, w.targets)
    sampler = DistributedSampler(data, args.world, args.rank, shuffle=True, seed=w.seed)
    loader = DataLoader(data, batch_size=w.global_batch // args.world, sampler=sampler)

    def step(batch):
        x, y = batch
        optimizer.zero_grad()
        loss = w.loss(model(x), y).mean()  # DDP averages the ranks' gradients
        loss.backward()
        optimizer.step()
        return len(x), loss.item()

    samples, seconds, loss = _timed_steps(
        step, _forever(loader, sampler.set_epoch), args.warmup, args.steps
    )
    total = torch.tensor([float(samples)])
    dist.all_reduce(total)  # the window's samples over all ranks
    world = dist.get_world_size()
    dist.barrier()  # no rank tears the group down while another still uses it
    dist.destroy_process_group()
    if args.rank:
        return None
    return {
        "samples": int(total.item()),
        "seconds": seconds,  # rank 0's, as the trainer's reports are
        "loss": loss,
        "threads": torch.get_num_threads(),
        "world": world,
    }


# --- the driver ---------------------------------------------------------------------------------


class SideFailed(RuntimeError):
    pass


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def _error_line(text: str) -> str:
    """The exception line of a traceback in ``text``, else its last non-empty line."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception)\b", line):
            return line[:300]
    return lines[-1][:300] if lines else "no output"


def _result_line(log: Path) -> dict:
    found = [x for x in log.read_text().splitlines() if x.startswith("RESULT ")]
    if not found:
        raise SideFailed(_error_line(log.read_text()))
    return json.loads(found[-1][7:])


def _wait(procs: list[subprocess.Popen], what: str) -> list[int]:
    """Wait for all of ``procs`` (each the leader of its own session); if one fails or time
    runs out, end the others and everything they started (an mpiexec's ranks too)."""
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while any(p.poll() is None for p in procs):
            if any(p.poll() for p in procs):
                break  # one failed: the others may wait for it in a collective for ever
            if time.monotonic() > deadline:
                raise SideFailed(f"{what} still running after {TIMEOUT_S} s")
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return [p.returncode for p in procs]


def _start(cmd: list[str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            cmd, cwd=ROOT, env=_env(), stdout=out, stderr=out, start_new_session=True
        )


def _launch(cmd: list[str], log: Path) -> Path:
    """Run ``cmd`` with its output in ``log``; SideFailed with the error if it fails."""
    if _wait([_start(cmd, log)], Path(cmd[0]).name)[0]:
        raise SideFailed(_error_line(log.read_text()))
    return log


def _side_cmd(workload: str, options: dict, warmup: int, steps: int, threads: int):
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--workload",
        workload,
        "--options",
        json.dumps(options),
        "--warmup",
        str(warmup),
        "--steps",
        str(steps),
        "--threads",
        str(threads),
    ]


def run_plain(tmp: Path, workload, options, loader, warmup, steps, threads) -> dict:
    cmd = [*_side_cmd(workload, options, warmup, steps, threads), "--side", "plain"]
    log = _launch([*cmd, "--loader", loader], tmp / "plain.log")
    return {**_result_line(log), "world": 1}


def run_ddp(tmp: Path, workload, options, world, warmup, steps, threads) -> dict:
    cmd = [*_side_cmd(workload, options, warmup, steps, threads), "--side", "ddp"]
    # A new store file for every run: gloo's file store must not be reused across groups.
    store = tmp / f"ddp-store-{time.monotonic_ns()}"
    init = f"file://{store}"
    logs = [tmp / f"ddp-{rank}.log" for rank in range(world)]
    procs = [
        _start([*cmd, "--rank", str(rank), "--world", str(world), "--init", init], logs[rank])
        for rank in range(world)
    ]
    codes = _wait(procs, "DDP ranks")
    if any(codes):
        bad = next(i for i, c in enumerate(codes) if c)
        raise SideFailed(_error_line(logs[bad].read_text()))
    return _result_line(logs[0])


def _reports(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def run_elastic(tmp: Path, workload, options, world, warmup, steps) -> dict:
    batch = options["global_batch"]
    record = tmp / "threads"
    opts = {**options, "record": str(record)}
    cmd = mpiexec_argv(world) + worker_argv(
        TASKS[workload],
        (warmup + steps) * batch,
        tmp / "ckpt",
        opts,
        checkpoint_every=10**9,
        report=tmp / "report.jsonl",
        result=tmp / "result.json",
    )
    _launch(cmd, tmp / "elastic.log")
    result = json.loads((tmp / "result.json").read_text())
    marks = [r for r in _reports(tmp / "report.jsonl") if r["event"] in ("start", "step")]
    # The window: the reports from the one at the end of the warm-up to the one at its end.
    # Each step report's rate is its samples over the seconds since the previous report.
    lo, hi = warmup * batch, (warmup + steps) * batch
    samples, seconds = 0, 0.0
    for prev, mark in zip(marks, marks[1:], strict=False):
        if mark["event"] == "step" and prev["samples"] >= lo and mark["samples"] <= hi:
            samples += mark["samples"] - prev["samples"]
            seconds += (mark["samples"] - prev["samples"]) / mark["rate"]
    threads = sorted({int(p.read_text()) for p in tmp.glob("threads.*")})
    return {
        "samples": samples,
        "seconds": seconds,
        "loss": next((m["loss"] for m in reversed(marks) if "loss" in m), None),
        "threads": threads[0] if len(threads) == 1 else threads,
        "world": sorted({m["world"] for m in marks}),
        "status": result["status"],
        "total_samples": result["samples"],
        "work": (warmup + steps) * batch,
    }


def _checks(side: str, r: dict, expected_samples: int, world: int, threads: int) -> list[str]:
    """What makes a measurement impossible to believe, in words (empty: none)."""
    why = []
    if r["samples"] != expected_samples:
        why.append(f"its window holds {r['samples']} samples, not {expected_samples}")
    if r["seconds"] <= 0:
        why.append(f"its window lasted {r['seconds']} s")
    if r["world"] not in (world, [world]):
        why.append(f"it ran at world {r['world']}, not {world}")
    if r["threads"] != threads:
        why.append(f"it ran {r['threads']} threads per rank, not {threads}")
    if "status" in r and (r["status"] != "done" or r["total_samples"] != r["work"]):
        why.append(f"the trainer ended {r['status']} after {r['total_samples']}/{r['work']}")
    return [f"{side}: {w}" for w in why]


def _threads(ranks: int) -> int:
    """As parsl_bf.training.trainer.share_cores sets them (one node: all ranks local)."""
    override = os.environ.get("PARSL_BF_THREADS_PER_RANK")
    return int(override) if override else max(1, (os.cpu_count() or 1) // ranks)


def _steps(samples: int, batch: int) -> int:
    """Steps for at least ``samples``, a whole number of report intervals."""
    per = REPORT_EVERY * batch
    return REPORT_EVERY * max(1, -(-samples // per))


def measure_cpu(args, tmp: Path) -> tuple[dict[str, list[float]], dict[str, dict], list[str]]:
    options = {"samples": args.dataset, "global_batch": args.batch, "hidden": args.hidden}
    steps = _steps(args.samples, args.batch)
    window = steps * args.batch
    runs: dict[str, list[float]] = {s: [] for s in SIDES}
    last: dict[str, dict] = {}
    suspect: list[str] = []
    for rep in range(args.repeat):
        for side in SIDES if rep % 2 == 0 else SIDES[::-1]:
            world, threads = WORLD[side], _threads(WORLD[side])
            d = tmp / f"{side}-{rep}"
            d.mkdir()
            if side.startswith("plain"):
                loader = "dataloader" if side == "plain" else "indexed"
                r = run_plain(d, "mlp", options, loader, args.warmup, steps, threads)
            elif side.startswith("ddp"):
                r = run_ddp(d, "mlp", options, world, args.warmup, steps, threads)
            else:
                r = run_elastic(d, "mlp", options, world, args.warmup, steps)
            bad = _checks(side, r, window, world, threads)
            suspect += [f"repeat {rep}, {b}" for b in bad]
            runs[side].append(r["samples"] / r["seconds"] if r["seconds"] > 0 else float("nan"))
            last[side] = r
            print(
                f"  repeat {rep} {LABELS[side]:<30} {runs[side][-1]:>10,.0f} samples/s",
                flush=True,
            )
    return runs, last, suspect


def measure_gpu(args, tmp: Path, device: str) -> dict:
    """ResNet-50, bf16 autocast: the trainer at world 1 against the plain loop, images/s."""
    cpu_dry_run = device == "cpu"  # --gpu-device cpu: the code path at a toy size, no CUDA
    batch = 8 if cpu_dry_run else 64
    options = {
        "samples": 4 * batch,
        "image": 32 if cpu_dry_run else 224,
        "global_batch": batch,
        "device": device,
    }
    warmup = REPORT_EVERY if cpu_dry_run else 2 * REPORT_EVERY
    steps = REPORT_EVERY if cpu_dry_run else _steps(args.gpu_samples, batch)
    threads = _threads(1)
    out: dict = {
        "model": _resnet50()[1],
        "device": torch.cuda.get_device_name(0) if device == "cuda" else device,
        "image": options["image"],
        "global_batch": batch,
        "window_images": steps * batch,
        "plain_images_s": None,
        "elastic_images_s": None,
        "ratio_w1_vs_plain": None,
        "runs": {"plain": [], "elastic_w1": []},
        "suspect": [],
    }
    for rep in range(args.repeat):
        for side in ("plain", "elastic_w1") if rep % 2 == 0 else ("elastic_w1", "plain"):
            if out.get(f"{side}_error"):
                continue
            d = tmp / f"gpu-{side}-{rep}"
            d.mkdir()
            try:
                if side == "plain":
                    r = run_plain(d, "resnet50", options, "indexed", warmup, steps, threads)
                else:
                    r = run_elastic(d, "resnet50", options, 1, warmup, steps)
            except SideFailed as exc:
                out[f"{side}_error"] = str(exc)
                continue
            out["suspect"] += [
                f"repeat {rep}, {b}" for b in _checks(side, r, steps * batch, 1, threads)
            ]
            out["runs"][side].append(r["samples"] / r["seconds"] if r["seconds"] > 0 else None)
    med = {s: _median(v) for s, v in out["runs"].items()}
    out["plain_images_s"], out["elastic_images_s"] = med["plain"], med["elastic_w1"]
    if med["plain"] and med["elastic_w1"]:
        ratio = med["elastic_w1"] / med["plain"]
        if ratio > W1_VS_PLAIN_MAX:
            out["suspect"].append(
                f"ratio_w1_vs_plain {ratio:.3f} > {W1_VS_PLAIN_MAX}: the same model on the same "
                "GPU cannot run that much faster in the trainer"
            )
        elif not out["suspect"]:
            out["ratio_w1_vs_plain"] = round(ratio, 3)
    return out


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None and v == v]
    return statistics.median(values) if values else None


def _r(x: float | None, digits: int = 1) -> float | None:
    return None if x is None else round(x, digits)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, help="samples per measurement window (32,000)")
    ap.add_argument("--repeat", type=int, help="measurements per side; the median is kept (5)")
    ap.add_argument("--quick", action="store_true", help="a small setting for a smoke test")
    ap.add_argument("--warmup", type=int, help="steps before the window (20; quick: 5)")
    ap.add_argument("--batch", type=int, default=64, help="global batch")
    ap.add_argument("--hidden", type=int, default=1024, help="the MLP's hidden width")
    ap.add_argument("--dataset", type=int, help="synthetic samples (8,192; quick: 2,048)")
    ap.add_argument("--gpu-samples", type=int, help="images per GPU window (6,400)")
    ap.add_argument("--gpu-device", default="cuda", help=argparse.SUPPRESS)  # "cpu": dry run
    # One side of one measurement, run by the driver in a process of its own:
    ap.add_argument("--side", choices=["plain", "ddp"], help=argparse.SUPPRESS)
    ap.add_argument("--workload", default="mlp", help=argparse.SUPPRESS)
    ap.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--loader", default="dataloader", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--init", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        result = plain_side(args) if args.side == "plain" else ddp_side(args)
        if result is not None:
            print("RESULT " + json.dumps(result), flush=True)
        return 0

    # A SIGTERM ends the driver through its finally blocks, which end the sides it started.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    quick = args.quick
    args.samples = args.samples or (6400 if quick else 32000)
    args.repeat = args.repeat or (3 if quick else 5)
    args.warmup = args.warmup or (REPORT_EVERY if quick else 4 * REPORT_EVERY)
    args.dataset = args.dataset or (2048 if quick else 8192)
    args.gpu_samples = args.gpu_samples or (1280 if quick else 6400)
    if args.warmup % REPORT_EVERY:
        ap.error(f"--warmup must be a multiple of {REPORT_EVERY} (the trainer's report interval)")
    if args.dataset % args.batch or args.batch % 2:
        ap.error("--dataset must be a multiple of --batch, and --batch even (split in two)")
    load_before = os.getloadavg()[0]
    began = time.monotonic()
    print(
        f"MLP 784-{args.hidden}-{args.hidden}-10, global batch {args.batch}, "
        f"{args.dataset} synthetic samples; window {_steps(args.samples, args.batch)} steps "
        f"after {args.warmup} warm-up, {args.repeat} repeat(s); {os.cpu_count()} cores, "
        f"load {load_before:.2f} before the run",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as d:
        tmp = Path(d)
        try:
            runs, last, suspect = measure_cpu(args, tmp)
        except SideFailed as exc:
            print(f"a side failed: {exc}", file=sys.stderr)
            return 1
        gpu_device = args.gpu_device
        has_gpu = gpu_device == "cpu" or torch.cuda.is_available()
        gpu = measure_gpu(args, tmp, gpu_device) if has_gpu else None

    med = {s: _median(v) for s, v in runs.items()}
    ratios: dict[str, float | None] = {"ratio_w1_vs_plain": None, "ratio_w2_vs_ddp": None}
    missing = [s for s in SIDES if med[s] is None]
    if missing:
        print(f"no figure for {', '.join(missing)}", file=sys.stderr)
        return 1
    w1 = med["elastic_w1"] / med["plain"]
    w2 = med["elastic_w2"] / med["ddp_w2"]
    w1_bad = [s for s in suspect if s.split(", ")[1].startswith(("plain", "elastic_w1"))]
    w2_bad = [s for s in suspect if s.split(", ")[1].startswith(("ddp_w2", "elastic_w2"))]
    if w1 > W1_VS_PLAIN_MAX:
        w1_bad.append(f"ratio_w1_vs_plain {w1:.3f} > {W1_VS_PLAIN_MAX}")
    # Against the indexed loop's fastest run, not its median: other load only slows a run
    # down, and this 2-thread loop is the side it disturbs most (12.6k-15.6k/s within one
    # quiet run here, the trainer's 15.9k-16.7k/s).
    best_indexed = max(runs["plain_indexed"])
    if med["elastic_w1"] > INDEXED_SLACK * best_indexed:
        w1_bad.append(
            f"elastic_w1 {med['elastic_w1']:,.0f}/s is over {INDEXED_SLACK}x the plain loop "
            f"without DataLoader's fastest run ({best_indexed:,.0f}/s), which does less work"
        )
    best_w1 = max(med["plain"], med["plain_indexed"], med["elastic_w1"])
    for side in ("ddp_w2", "elastic_w2"):
        if med[side] > 2 * best_w1:
            w2_bad.append(
                f"{side} {med[side]:,.0f}/s is over twice the best world-1 rate "
                f"({best_w1:,.0f}/s) on the same cores: not possible on an idle machine "
                "(other load starves the 2-thread world-1 runs more)"
            )
    if not w1_bad:
        ratios["ratio_w1_vs_plain"] = round(w1, 3)
    if not w2_bad:
        ratios["ratio_w2_vs_ddp"] = round(w2, 3)
    suspect = sorted(set(suspect) | set(w1_bad) | set(w2_bad))

    print()
    print(
        f"{'side':<30} {'ranks':>5} {'threads':>7} {'samples/s':>10} {'min':>9} {'max':>9} "
        f"{'last loss':>9}"
    )
    for side in SIDES:
        v, r = runs[side], last[side]
        loss = "-" if r["loss"] is None else f"{r['loss']:.3f}"
        print(
            f"{LABELS[side]:<30} {WORLD[side]:>5} {str(r['threads']):>7} {med[side]:>10,.0f} "
            f"{min(v):>9,.0f} {max(v):>9,.0f} {loss:>9}"
        )
    for name, value, raw, target in (
        ("ratio_w1_vs_plain", ratios["ratio_w1_vs_plain"], w1, 0.97),
        ("ratio_w2_vs_ddp", ratios["ratio_w2_vs_ddp"], w2, 1.0),
    ):
        shown = f"{value:.3f}" if value is not None else f"SUSPECT (measured {raw:.3f})"
        print(f"{name:<30} {shown}   (target >= {target})")
    if gpu is None:
        print("gpu: no CUDA device here (torch.cuda.is_available() is False): skipped")
    else:
        shown = gpu["ratio_w1_vs_plain"]
        print(
            f"gpu {gpu['model']} on {gpu['device']}, bf16 autocast, batch {gpu['global_batch']}: "
            f"plain {_r(gpu['plain_images_s'])} images/s, elastic w1 "
            f"{_r(gpu['elastic_images_s'])} images/s, ratio "
            f"{shown if shown is not None else 'n/a'}"
        )
        for side in ("plain", "elastic_w1"):
            if gpu.get(f"{side}_error"):
                print(f"  gpu {side} failed: {gpu[f'{side}_error']}")
    for s in suspect + (gpu["suspect"] if gpu else []):
        print(f"SUSPECT {s}")
    print(f"({time.monotonic() - began:.0f} s)")
    if gpu is not None:
        gpu = {**gpu, "plain_images_s": _r(gpu["plain_images_s"])}
        gpu["elastic_images_s"] = _r(gpu["elastic_images_s"])
        gpu["runs"] = {k: [_r(x) for x in v] for k, v in gpu["runs"].items()}
    figures = {
        **ratios,
        "gpu": gpu,
        "samples_per_s": {s: _r(med[s]) for s in SIDES},
        "runs": {s: [_r(x) for x in v] for s, v in runs.items()},
        "threads": {"w1": _threads(1), "w2": _threads(2)},
        "window_samples": _steps(args.samples, args.batch) * args.batch,
        "warmup_steps": args.warmup,
        "repeat": args.repeat,
        "global_batch": args.batch,
        "model": f"mlp 784-{args.hidden}-{args.hidden}-10",
        "cores": os.cpu_count(),
        "load_before": round(load_before, 2),
        "suspect": suspect,
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
