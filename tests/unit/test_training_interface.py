"""The training interface's checks and pieces, on one rank in this process."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from mpi4py import MPI

from parsl_bf.training import TrainingInputError
from parsl_bf.training.batches import open_samples
from parsl_bf.training.data import step_plan, total_steps
from parsl_bf.training.examples import digits_cnn
from parsl_bf.training.syncbn import MPIBatchNorm, convert_batchnorm
from parsl_bf.training.trainer import ElasticTrainer


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("model", None, "model: expected a callable"),
        ("loss", None, "loss: needed unless the task has a custom step"),
        ("global_batch", 0, "global_batch: expected an integer >= 1"),
        ("precision", "fp8", "precision: expected one of fp32, bf16, fp16"),
        ("device", "tpu", "device: expected one of auto, cpu, cuda"),
        ("evaluate_every", 0, "evaluate_every: expected samples >= 1"),
        ("clip_grad_norm", math.nan, "clip_grad_norm: expected a positive number"),
        ("loader_workers", -1, "loader_workers: expected an integer >= 0"),
        ("state", {"ema": object()}, "state['ema']: object has no state_dict()"),
        ("scheduler", 3, "scheduler: expected a callable"),
    ],
)
def test_a_field_that_cannot_work_is_named(field, value, message) -> None:
    task = digits_cnn()
    setattr(task, field, value)
    with pytest.raises(TrainingInputError, match=re.escape(message)):
        task.check()


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: torch.utils.data.TensorDataset(torch.zeros(0, 2)), "returned no samples"),
        (lambda: 42, "dataset: returned int; expected (inputs, targets) tensors"),
        (lambda: (torch.zeros(3, 2), torch.zeros(4)), "inputs and targets differ in length"),
    ],
)
def test_a_dataset_of_the_wrong_shape_is_named(factory, message) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        open_samples(factory())


def test_wrong_factory_results_are_named(tmp_path) -> None:
    task = digits_cnn()
    task.optimizer = lambda params: "sgd"
    with pytest.raises(TrainingInputError, match="optimizer: returned str"):
        ElasticTrainer(task, MPI.COMM_SELF, tmp_path, 64).run()


@given(
    n=st.integers(1, 300),
    batch=st.integers(1, 64),
    work=st.integers(1, 1000),
)
def test_total_steps_counts_the_plans_steps(n, batch, work) -> None:
    steps = list(step_plan(0, n, batch, 0, work, 1, 0))
    assert len(steps) == total_steps(work, n, batch)
    assert sum(b for b, _ in steps) == work


def test_global_batchnorm_on_one_rank_is_batchnorm() -> None:
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    ours = convert_batchnorm(copy.deepcopy(ref), MPI.COMM_SELF)
    assert isinstance(ours[1], MPIBatchNorm) and ours.state_dict().keys() == ref.state_dict().keys()
    x = torch.randn(5, 3, 8, 8)
    a, b = ref(x), ours(x)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    a.square().sum().backward()
    b.square().sum().backward()
    for p, q in zip(ref.parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
    for key, value in ref.state_dict().items():  # running statistics
        torch.testing.assert_close(value.float(), ours.state_dict()[key].float())
    ref.eval()
    ours.eval()
    torch.testing.assert_close(ref(x), ours(x))
    # An empty share still takes part (its collectives must match the other ranks').
    assert ours.train()(torch.zeros(0, 3, 8, 8)).shape == (0, 4, 6, 6)


def test_a_map_style_dataset_trains_like_the_same_tensors(tmp_path) -> None:
    """Same samples as tensors or as a Dataset (through a DataLoader): the same model."""
    tensors = digits_cnn(global_batch=32)
    dataset = digits_cnn(global_batch=32)
    x, y = tensors.dataset()
    dataset.dataset = lambda: torch.utils.data.TensorDataset(x, y)
    a = ElasticTrainer(tensors, MPI.COMM_SELF, tmp_path / "a", 500).run()
    b = ElasticTrainer(dataset, MPI.COMM_SELF, tmp_path / "b", 500).run()
    assert a.samples == b.samples == 500 and a.loss == pytest.approx(b.loss, rel=1e-6)


def test_a_custom_step_and_a_scheduler(tmp_path) -> None:
    task = digits_cnn(global_batch=32)
    loss = task.loss
    seen = []

    def step(model, batch, ctx):
        seen.append((ctx.batch, ctx.steps, ctx.samples))
        x, y = batch
        return loss(model(x), y)  # per-sample losses: the trainer sums them

    task.step, task.loss = step, None
    task.scheduler = lambda opt, total: torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.0, total)
    out = ElasticTrainer(task, MPI.COMM_SELF, tmp_path, 100).run()
    assert out.steps == total_steps(100, 1437, 32) == 4
    assert seen == [(32, 0, 0), (32, 1, 32), (32, 2, 64), (4, 3, 96)]
    state = torch.load(out.checkpoint, weights_only=False)
    assert state["scheduler"]["last_epoch"] == 4
    assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.0, abs=1e-12)
