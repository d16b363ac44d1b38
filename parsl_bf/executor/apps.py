"""``elastic_app``: a Parsl app that is an elastic training task on a BackfillExecutor."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from parsl.app.app import python_app

__all__ = ["elastic_app", "train_in_process"]


def train_in_process(
    task: str, options: dict[str, Any], work: int, parsl_resource_specification=None
) -> dict[str, Any]:
    """Train on one rank in this process: what an elastic app does on any other executor
    (e.g. a stock HighThroughputExecutor). A BackfillExecutor never calls it."""
    import tempfile
    from dataclasses import asdict

    from mpi4py import MPI

    from parsl_bf.training.trainer import ElasticTrainer
    from parsl_bf.training.worker import load_task

    with tempfile.TemporaryDirectory(prefix="parsl-bf-train-") as d:
        trainer = ElasticTrainer(load_task(task, options), MPI.COMM_SELF, d, work)
        outcome = asdict(trainer.run())
    outcome["checkpoint"] = None  # the directory is gone
    return outcome


def elastic_app(
    task: str,
    *,
    work: int,
    min_nodes: int = 1,
    max_nodes: int = 1,
    scaling: dict[int, float] | None = None,
    rescale_s: float | None = None,
    executors: list[str] | str = "all",
) -> Callable[..., Future]:
    """An app that trains ``task`` (``module:function`` returning a TrainingTask) for ``work``
    samples on ``min_nodes``..``max_nodes`` nodes, resized by the allocator.

        train = elastic_app("parsl_bf.training.examples:digits_cnn", work=20000, max_nodes=4)
        future = train(lr=0.05, width=16)  # the task's options; resolves to the outcome dict

    ``scaling`` (samples/s per node count) and ``rescale_s`` are optional guesses; measured
    values replace them. The same call on another executor trains on one rank.
    """
    spec: dict[str, Any] = {"work": work, "min_nodes": min_nodes, "max_nodes": max_nodes}
    if scaling:
        spec["scaling"] = dict(scaling)
    if rescale_s is not None:
        spec["rescale_s"] = rescale_s
    app = python_app(train_in_process, executors=executors)

    def submit(**options: Any) -> Future:
        resources = spec | {"task": task, "options": options}
        return app(task, options, work, parsl_resource_specification=resources)

    submit.__name__ = submit.__qualname__ = task.rpartition(":")[2] or "elastic_app"
    return submit
