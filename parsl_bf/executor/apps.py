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


def _targets(executors: list[str] | str) -> tuple[list[str], list[str] | str]:
    """Labels of the loaded BackfillExecutors among ``executors``, and the others."""
    import parsl

    from .executor import BackfillExecutor

    loaded = {k: v for k, v in parsl.dfk().executors.items() if k != "_parsl_internal"}
    wanted = list(loaded) if executors == "all" else list(executors)
    elastic = [k for k in wanted if isinstance(loaded.get(k), BackfillExecutor)]
    return elastic, [k for k in wanted if k not in elastic]


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
    values replace them. When the loaded config has BackfillExecutors among ``executors``, the
    task goes to them; otherwise (e.g. a stock HighThroughputExecutor) it trains on one rank in
    a worker, so a workflow runs unchanged on any config.
    """
    spec: dict[str, Any] = {"work": work, "min_nodes": min_nodes, "max_nodes": max_nodes}
    if scaling:
        spec["scaling"] = dict(scaling)
    if rescale_s is not None:
        spec["rescale_s"] = rescale_s

    def submit(**options: Any) -> Future:
        elastic, plain = _targets(executors)
        if elastic:
            app = python_app(train_in_process, executors=elastic)
            resources = spec | {"task": task, "options": options}
            return app(task, options, work, parsl_resource_specification=resources)
        # Stock executors refuse the elastic resource specification (HTEX takes `priority`).
        return python_app(train_in_process, executors=plain)(task, options, work)

    submit.__name__ = submit.__qualname__ = task.rpartition(":")[2] or "elastic_app"
    return submit
