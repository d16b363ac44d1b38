"""``elastic_app``: a Parsl app that is an elastic training task on a BackfillExecutor."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from parsl.app.app import python_app

if TYPE_CHECKING:
    from .executor import BackfillExecutor

__all__ = ["elastic_app", "node_limit", "train_in_process"]


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


def node_limit(executor: BackfillExecutor) -> int:
    """The most nodes ``executor`` can ever hold at once: ``max_blocks`` pilots of at most
    ``max_nodes`` nodes each (``nodes_per_block`` for a provider without ``max_nodes``), and
    no more than the cluster has where the provider knows it (the local emulation's
    ``nodes``)."""
    provider = executor.provider
    per_pilot = getattr(provider, "max_nodes", None) or getattr(provider, "nodes_per_block", 1)
    limit = max(1, int(getattr(provider, "max_blocks", 1) or 1)) * max(1, int(per_pilot or 1))
    nodes = getattr(provider, "nodes", None)
    if isinstance(nodes, int) and nodes > 0:
        limit = min(limit, nodes)
    return limit


def _targets(executors: list[str] | str) -> tuple[dict[str, BackfillExecutor], list[str]]:
    """The loaded BackfillExecutors among ``executors`` (label → executor), and the others."""
    import parsl

    from .executor import BackfillExecutor

    loaded = {k: v for k, v in parsl.dfk().executors.items() if k != "_parsl_internal"}
    wanted = list(loaded) if executors == "all" else list(executors)
    elastic = {k: loaded[k] for k in wanted if isinstance(loaded.get(k), BackfillExecutor)}
    return elastic, [k for k in wanted if k not in elastic]


def elastic_app(
    task: str,
    *,
    work: int,
    min_nodes: int = 1,
    max_nodes: int | None = None,
    scaling: dict[int, float] | None = None,
    rescale_s: float | None = None,
    name: str | None = None,
    executors: list[str] | str = "all",
) -> Callable[..., Future]:
    """An app that trains ``task`` (``module:function`` returning a TrainingTask) for ``work``
    samples on ``min_nodes``..``max_nodes`` nodes, resized by the allocator.

        train = elastic_app("parsl_bf.training.examples:digits_cnn", work=20000)
        future = train(lr=0.05, width=16)  # the task's options; resolves to the outcome dict

    ``max_nodes=None`` (the default) lets the task grow to as many nodes as the allocator
    gives it: the bound sent to the BackfillExecutor is the most nodes its provider can hold
    at once (:func:`node_limit`: ``max_blocks`` × the provider's ``max_nodes``, at most its
    cluster's ``nodes``; the largest over the target executors, and never below
    ``min_nodes``). Give ``max_nodes`` to cap it, e.g. where the model stops scaling.
    ``min_nodes`` > ``max_nodes`` is refused with a ValueError.

    ``scaling`` (samples/s per node count) and ``rescale_s`` are optional guesses; measured
    values replace them. ``name`` is the task's key across runs (its checkpoint directory) for
    an app submitted once; without it, the key is a digest of ``task``, ``work`` and the
    options, so a rerun of the same workflow continues each trial where it was.

    When the loaded config has BackfillExecutors among ``executors``, the task goes to them;
    otherwise (e.g. a stock HighThroughputExecutor) it trains on one rank in a worker, so a
    workflow runs unchanged on any config.
    """
    if min_nodes < 1:
        raise ValueError(f"elastic_app({task!r}): min_nodes must be at least 1, not {min_nodes}")
    if max_nodes is not None and min_nodes > max_nodes:
        raise ValueError(
            f"elastic_app({task!r}): min_nodes ({min_nodes}) > max_nodes ({max_nodes}); "
            "leave max_nodes out to let the task grow as far as the nodes allow"
        )
    spec: dict[str, Any] = {"work": work, "min_nodes": min_nodes}
    if scaling:
        spec["scaling"] = dict(scaling)
    if rescale_s is not None:
        spec["rescale_s"] = rescale_s
    if name is not None:
        spec["name"] = name

    def submit(**options: Any) -> Future:
        elastic, plain = _targets(executors)
        if elastic:
            # A finite bound always: the executor reads a missing max_nodes as min_nodes, and
            # the controller's scaling curve and pilot requests need a number.
            bound = max_nodes
            if bound is None:
                bound = max(min_nodes, *(node_limit(e) for e in elastic.values()))
            app = python_app(train_in_process, executors=list(elastic))
            resources = spec | {"max_nodes": bound, "task": task, "options": options}
            return app(task, options, work, parsl_resource_specification=resources)
        # Stock executors refuse the elastic resource specification (HTEX takes `priority`).
        return python_app(train_in_process, executors=plain)(task, options, work)

    submit.__name__ = submit.__qualname__ = task.rpartition(":")[2] or "elastic_app"
    return submit
