"""Pure parts of the trainer: sample accounting, the flat gradient buffer, checkpoints, reports."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parsl_bf.training import (
    CheckpointError,
    FlatGradients,
    ReportSink,
    ScalingProfiler,
    epoch_order,
    load_latest,
    rank_share,
    read_reports,
    save_checkpoint,
    step_indices,
)
from parsl_bf.training.checkpoint import AUTO_MAX_OVERHEAD, AUTO_STEPS, Cadence, checkpoints
from parsl_bf.training.data import step_batch
from parsl_bf.training.exchange import fingerprint
from parsl_bf.training.reports import step_spans


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 300),
    batch=st.integers(1, 64),
    worlds=st.lists(st.integers(1, 8), min_size=1, max_size=30),
    seed=st.integers(0, 2**16),
)
def test_every_sample_once_per_epoch_whatever_the_world_sizes(n, batch, worlds, seed) -> None:
    """Steps at changing world sizes, as after rescales: each epoch is an exact permutation."""
    seen: dict[int, list[int]] = {}
    samples, k = 0, 0
    while samples < 2 * n:
        world = worlds[k % len(worlds)]
        epoch, offset = divmod(samples, n)
        order = epoch_order(seed, epoch, n)
        b = step_batch(batch, n, offset, 2 * n - samples)
        for rank in range(world):
            seen.setdefault(epoch, []).extend(step_indices(order, offset, b, world, rank).tolist())
        samples += b
        k += 1
    for epoch in (0, 1):
        assert sorted(seen[epoch]) == list(range(n))


@given(batch=st.integers(0, 500), world=st.integers(1, 64))
def test_rank_shares_tile_the_batch(batch, world) -> None:
    shares = [rank_share(batch, world, r) for r in range(world)]
    assert shares[0][0] == 0 and shares[-1][1] == batch
    assert all(a[1] == b[0] for a, b in zip(shares, shares[1:], strict=False))
    sizes = [b - a for a, b in shares]
    assert max(sizes) - min(sizes) <= 1


def test_gradients_land_in_one_flat_buffer() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    grads = FlatGradients(list(model.parameters()))
    assert grads.buffer.numel() == sum(p.numel() for p in model.parameters())
    model(torch.randn(5, 3)).sum().backward()
    offset = 0
    for p in model.parameters():
        n = p.numel()
        assert torch.equal(grads.buffer[offset : offset + n].view_as(p), p.grad)
        offset += n
    assert grads.buffer.abs().sum() > 0
    grads.zero()
    assert all(float(p.grad.abs().sum()) == 0 for p in model.parameters())
    torch.optim.SGD(model.parameters(), lr=0.1).zero_grad(set_to_none=True)
    grads.rebind()
    assert all(p.grad is not None for p in model.parameters())


def test_the_model_fingerprint_is_exact_whatever_the_order_of_the_sum() -> None:
    """Values over ten orders of magnitude, whose floating-point sum (even in double) rounds
    differently in another order or thread count: the fingerprint is the same in any order
    and any thread count, and tells one changed element apart."""
    torch.manual_seed(0)
    values = torch.randn(300_000) * torch.logspace(-8, 2, 300_000)
    p = torch.nn.Parameter(values)
    shuffled = torch.nn.Parameter(values[torch.randperm(values.numel())])
    threads = torch.get_num_threads()
    try:
        digests = []
        for n in (1, 2):
            torch.set_num_threads(n)
            digests += [fingerprint([p]).tolist(), fingerprint([shuffled]).tolist()]
    finally:
        torch.set_num_threads(threads)
    assert all(d == digests[0] for d in digests)
    changed = values.clone()
    changed[7] = torch.nextafter(changed[7], torch.tensor(2.0))
    assert fingerprint([torch.nn.Parameter(changed)]).tolist() != digests[0]
    half = torch.nn.Parameter(torch.ones(3, 4, dtype=torch.bfloat16).t())  # 2-byte, strided
    assert fingerprint([half, p]).tolist()[-1] == 2


def test_checkpoints_are_atomic_and_the_newest_readable_wins(tmp_path) -> None:
    for samples in (64, 128, 192):
        save_checkpoint(tmp_path, {"samples": samples, "w": torch.ones(2) * samples}, samples)
    assert [int(p.name[5:-3]) for p in checkpoints(tmp_path)] == [192, 128]  # keeps two
    (tmp_path / ".ckpt-000000000000999.pt.7.tmp").write_bytes(b"half a file")
    assert load_latest(tmp_path)["samples"] == 192
    (tmp_path / "ckpt-000000000000256.pt").write_bytes(b"corrupt")
    assert load_latest(tmp_path)["samples"] == 192
    assert load_latest(tmp_path / "empty") is None
    for p in checkpoints(tmp_path):
        p.write_bytes(b"corrupt")
    with pytest.raises(CheckpointError, match="no readable checkpoint"):
        load_latest(tmp_path)


def test_profiler_learns_the_curve_and_the_rescale_cost(tmp_path) -> None:
    sink = ReportSink(tmp_path / "r" / "report.jsonl")
    for world, rates in ((1, [100, 110, 90]), (2, [190, 180])):
        for rate in rates:
            sink.emit("step", world=world, samples=0, rate=rate, loss=1.0)
    sink.emit("start", world=2, samples=64, first_step_at=1003.5, stopped_at=1000.0)
    with (tmp_path / "r" / "report.jsonl").open("a") as f:
        f.write('{"t": 1, "event": "st')  # a line being written
    profiler = ScalingProfiler(read_reports(tmp_path / "r" / "report.jsonl"))
    assert profiler.curve() == ([0, 1, 2], [0.0, 100.0, 185.0])
    assert profiler.rescale_cost() == pytest.approx(3.5)
    assert np.all(np.diff(profiler.curve()[0]) > 0)


def test_the_sustained_rate_counts_slow_steps_and_no_gap_between_runs() -> None:
    reports = [
        {"t": 0.0, "event": "start", "world": 1, "samples": 0},
        {"t": 1.0, "event": "step", "world": 1, "samples": 100, "rate": 100.0},
        {"t": 2.0, "event": "step", "world": 1, "samples": 200, "rate": 100.0},
        {"t": 3.0, "event": "step", "world": 1, "samples": 300, "rate": 100.0},
        {"t": 5.0, "event": "step", "world": 1, "samples": 400, "rate": 50.0},  # a checkpoint
        {"t": 6.0, "event": "stopped", "samples": 400},
        # Restarted at the same size 14 s later: the time without a fragment is no span.
        {"t": 20.0, "event": "start", "world": 1, "samples": 400},
        {"t": 21.0, "event": "step", "world": 1, "samples": 500, "rate": 100.0},
        {"t": 22.0, "event": "step", "world": 2, "samples": 700, "rate": 200.0},
    ]
    assert step_spans(reports) == [(1, 100, 1.0, 1.0), (1, 100, 1.0, 2.0), (1, 100, 2.0, 3.0)]
    profiler = ScalingProfiler(reports)
    assert profiler.curve()[1][1] == 100.0  # the median leaves the slow step out
    assert profiler.sustained(1) == pytest.approx(300 / 4)
    assert profiler.sustained(2) is None  # one step report at that size: no span


def test_digits_read_directly_equal_scikit_learns() -> None:
    from sklearn.datasets import load_digits

    from parsl_bf.training.examples import _digits_arrays

    images, labels = _digits_arrays()
    reference = load_digits()
    assert np.array_equal(images, reference.images)
    assert np.array_equal(labels, reference.target)


def test_report_tail_reads_only_new_complete_lines(tmp_path) -> None:
    from parsl_bf.training.reports import ReportTail

    path = tmp_path / "progress.jsonl"
    tail = ReportTail(path)
    assert tail.read() == []  # not there yet
    path.write_text('{"event": "start"}\n{"event": "st')  # the writer is mid-line
    assert tail.read() == [{"event": "start"}]
    with path.open("a") as f:
        f.write('ep", "samples": 64}\n{"event": "step", "samples": 128}\n')
    assert [r["samples"] for r in tail.read()] == [64, 128]
    assert tail.read() == []
    path.write_text('{"event": "done"}\n')  # written anew (shorter): read from the start
    assert tail.read() == [{"event": "done"}]


def test_a_fixed_cadence_checkpoints_at_every_multiple_whatever_the_clock() -> None:
    cadence = Cadence(20, steps=35)  # resumed at step 35: the multiples stay where they were
    due = [k for k in range(36, 101) if cadence.due(k, now=0.0)]
    assert due == [40, 60, 80, 100]
    with pytest.raises(ValueError, match="positive"):
        Cadence(0)


@settings(max_examples=200, deadline=None)
@given(
    step_s=st.floats(1e-4, 2.0),
    cost_s=st.floats(0.0, 5.0),
    start=st.integers(0, 10**6),
)
def test_the_auto_cadence_keeps_checkpoints_under_their_share_of_the_time(step_s, cost_s, start):
    """Steps of ``step_s``, each checkpoint taking ``cost_s``: at least AUTO_STEPS steps apart,
    and in the long run at most AUTO_MAX_OVERHEAD of the time spent writing (plus one step's
    rounding); a cheap checkpoint comes every AUTO_STEPS steps."""
    cadence = Cadence(None, steps=start)
    now, writing, saves, last = 0.0, 0.0, [], start
    for k in range(start + 1, start + 4001):
        now += step_s
        if cadence.due(k, now):
            assert k - last >= AUTO_STEPS
            cadence.saved(k, now, now + cost_s)
            now += cost_s
            writing += cost_s
            saves.append(k)
            last = k
    assert saves  # 4,000 steps hold at least one checkpoint whatever the costs here
    if cost_s <= AUTO_MAX_OVERHEAD * AUTO_STEPS * step_s:
        # Cheap: the fixed step count decides.
        assert saves[1:] == [saves[0] + AUTO_STEPS * i for i in range(1, len(saves))]
    else:  # expensive: the time between two checkpoints pays for them, to within one step
        floor, eps = cost_s / AUTO_MAX_OVERHEAD, 1e-9 * (1 + cost_s / AUTO_MAX_OVERHEAD)
        for a, b in zip(saves, saves[1:], strict=False):
            assert floor - eps <= (b - a) * step_s <= floor + step_s + eps
