"""Plain-data inputs and outputs of the allocator.

A :class:`TaskSpec` describes one elastic training task as the allocator sees it at one event;
an :class:`AllocationProblem` is one event's decision: the tasks, the free nodes and the
objective. Both are immutable and validated on construction, so every solver can trust them:
every number is finite, and sizes are bounded (:data:`MAX_NODES`, :data:`MAX_TASKS`,
:data:`MAX_COUNTS`, ...) generously for real machines (Theta's 4,734 nodes, decisions over
hundreds of tasks) but so that no input, however small its file, makes the solvers' tables
outgrow memory or the objective overflow.
"""

from __future__ import annotations

from enum import StrEnum
from functools import cached_property
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..decisions import caps_remaining_work
from .errors import AllocationInputError

__all__ = [
    "MAX_COUNTS",
    "MAX_EXACT_WORK",
    "MAX_NODES",
    "MAX_RATE",
    "MAX_SECONDS",
    "MAX_TASKS",
    "MAX_WEIGHT",
    "MAX_WORK",
    "Objective",
    "TaskSpec",
    "AllocationProblem",
    "Allocation",
    "SolveStatus",
]

#: The most nodes any count may be: a task's min/max/current nodes, a curve's breakpoints, the
#: free nodes and the capacity (free plus held).
MAX_NODES = 100_000
#: The most tasks in one problem.
MAX_TASKS = 10_000
#: The most node counts the tasks' domains {0} ∪ [min, min(max, capacity)] hold together: the
#: rows of the gain tables every solver builds (a few hundred MB at this limit).
MAX_COUNTS = 5_000_000
#: The most cell updates (counts × capacity) the exact program may be asked for by
#: ``parsl-bf solve --solver exact``, or to check GLPK's incumbent at its time limit (some ten
#: seconds; the MILP takes larger instances).
MAX_EXACT_WORK = 5 * 10**10
#: The longest look-ahead (``tfwd``) and rescale cost, in seconds (ten years).
MAX_SECONDS = 10 * 365 * 86400
#: The highest throughput or objective-curve value (samples/s).
MAX_RATE = 1e12
#: The most samples of remaining work.
MAX_WORK = 1e18
#: The largest priority weight.
MAX_WEIGHT = 1e6


class Objective(StrEnum):
    """What the allocator maximises; the formulas are in :mod:`parsl_bf.allocation.gains`."""

    THROUGHPUT = "throughput"
    SPEEDUP = "speedup"
    WEIGHTED = "weighted"
    FAIR = "fair"
    REMAINING_WORK = "remaining_work"
    BALANCED = "balanced"
    SPEEDUP_BALANCED = "speedup_balanced"

    @property
    def uses_remaining_work(self) -> bool:
        """Whether this objective's gains depend on each task's ``remaining_work``."""
        return self in (Objective.REMAINING_WORK, *_BALANCING)

    @property
    def per_speedup(self) -> bool:
        """Whether a task's gain is its speedup P(n) / P(1), whatever its objective curve."""
        return self in (Objective.SPEEDUP, Objective.SPEEDUP_BALANCED)


_BALANCING = (Objective.BALANCED, Objective.SPEEDUP_BALANCED)


class SolveStatus(StrEnum):
    OPTIMAL = "optimal"  # proven optimal (by GLPK or by the exact program)
    # GLPK's incumbent at the time limit, no worse than the exact program's (when that ran).
    FEASIBLE = "feasible"
    FALLBACK = "fallback"  # at the time limit GLPK had none, or a worse one: exact program's plan


# allow_inf_nan: NaN passes every ge/le bound (it fails no comparison), inf passes ge=0.
_FROZEN = ConfigDict(frozen=True, extra="forbid", strict=False, allow_inf_nan=False)


class TaskSpec(BaseModel):
    """One elastic training task at one allocation event.

    ``nodes``/``throughput`` are the scaling curve: samples/s at those node counts, linearly
    interpolated in between (the curve need not be concave). ``value``, when given, is the curve
    the ``throughput`` objective maximises instead of the throughput (as in the paper's
    "speedup" job sets); progress is always measured with ``throughput``.
    """

    model_config = _FROZEN

    id: str = Field(min_length=1, max_length=1000)
    min_nodes: int = Field(ge=1, le=MAX_NODES, description="fewest nodes the task can run on")
    max_nodes: int = Field(ge=1, le=MAX_NODES, description="most nodes the task can use")
    current_nodes: int = Field(0, ge=0, le=MAX_NODES, description="nodes the task holds now")
    nodes: tuple[int, ...] = Field(description="breakpoints of the scaling curve, from 0")
    throughput: tuple[float, ...] = Field(description="samples/s at each breakpoint")
    value: tuple[float, ...] | None = Field(None, description="objective curve, optional")
    rescale_up_s: float = Field(
        0.0, ge=0, le=MAX_SECONDS, description="seconds of progress lost to a grow"
    )
    rescale_down_s: float = Field(
        0.0, ge=0, le=MAX_SECONDS, description="seconds of progress lost to a shrink"
    )
    weight: float = Field(
        1.0, ge=0, le=MAX_WEIGHT, description="priority for the `weighted` objective"
    )
    remaining_work: float | None = Field(None, ge=0, le=MAX_WORK, description="samples left to do")

    @field_validator("id", mode="before")
    @classmethod
    def _id_as_str(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) else v

    @field_validator("nodes")
    @classmethod
    def _nodes_ok(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if len(v) < 2:
            raise ValueError("needs at least two breakpoints")
        if v[0] != 0:
            raise ValueError("the curve must start at 0 nodes")
        if any(b <= a for a, b in zip(v, v[1:], strict=False)):
            raise ValueError("node counts must be strictly increasing")
        if v[-1] > MAX_NODES:
            raise ValueError(f"breakpoint {v[-1]} is more than the limit of {MAX_NODES} nodes")
        return v

    @field_validator("throughput", "value")
    @classmethod
    def _curve_ok(cls, v: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if v is not None and any(not (0 <= x <= MAX_RATE) for x in v):
            raise ValueError(f"must be finite, non-negative and at most {MAX_RATE:g}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> TaskSpec:
        for name in ("throughput", "value"):
            curve = getattr(self, name)
            if curve is not None and curve and curve[0] != 0:
                raise _field_error(name, "must be 0 at 0 nodes (a stopped task makes no progress)")
        if self.min_nodes > self.max_nodes:
            raise _field_error(
                "min_nodes", f"min_nodes {self.min_nodes} > max_nodes {self.max_nodes}"
            )
        if len(self.throughput) != len(self.nodes):
            raise _field_error("throughput", "must have one entry per breakpoint in nodes")
        if self.value is not None and len(self.value) != len(self.nodes):
            raise _field_error("value", "must have one entry per breakpoint in nodes")
        if self.max_nodes > self.nodes[-1]:
            raise _field_error(
                "max_nodes",
                f"{self.max_nodes} lies beyond the curve's last breakpoint {self.nodes[-1]}",
            )
        return self

    @cached_property
    def need_node_s(self) -> float | None:
        """Node-seconds the remaining work takes at the task's most efficient count, if known."""
        if self.remaining_work is None:
            return None
        counts = np.arange(self.min_nodes, self.max_nodes + 1)
        per_node = np.interp(counts, self.nodes, self.throughput) / counts
        best = float(per_node.max())
        return self.remaining_work / best if best > 0 else 0.0


class AllocationProblem(BaseModel):
    """One allocation event: decide a node count for every task.

    Capacity is ``free_nodes`` plus the nodes the tasks hold now; nodes lost to preemption
    must already be removed from both. ``tfwd`` is the look-ahead horizon in seconds over
    which the gain of an allocation is weighed against its rescale cost.
    """

    model_config = _FROZEN

    tasks: tuple[TaskSpec, ...] = Field(max_length=MAX_TASKS)
    free_nodes: int = Field(ge=0, le=MAX_NODES)
    tfwd: float = Field(10.0, gt=0, le=MAX_SECONDS)
    objective: Objective = Objective.THROUGHPUT
    cap_at_remaining_work: bool = Field(
        False,
        description="count no gain beyond each task's remaining work while no task waits for "
        "admission (any objective; see ``caps_remaining_work``)",
    )
    tasks_waiting: bool = Field(
        False,
        description="some task is submitted but not among ``tasks``, for want of an admission "
        "slot: ``speedup_balanced`` balances, and ``cap_at_remaining_work`` caps (unless "
        "``cap_while_waiting``), only when none waits",
    )
    cap_while_waiting: bool = Field(
        False,
        description="with ``cap_at_remaining_work``, cap while tasks wait too: for tasks as "
        "short as their successor's start (the executor's fragments)",
    )

    @field_validator("tasks")
    @classmethod
    def _tasks_ok(cls, v: tuple[TaskSpec, ...]) -> tuple[TaskSpec, ...]:
        if not v:
            raise ValueError("needs at least one task")
        seen: set[str] = set()
        for t in v:
            if t.id in seen:
                raise ValueError(f"duplicate task id {t.id!r}")
            seen.add(t.id)
        return v

    @model_validator(mode="after")
    def _bounded(self) -> AllocationProblem:
        if self.capacity > MAX_NODES:
            raise _field_error(
                "free_nodes",
                f"free nodes plus the tasks' current nodes make {self.capacity}, more than the "
                f"limit of {MAX_NODES}",
            )
        counts = self.domain_size
        if counts > MAX_COUNTS:
            raise _field_error(
                "tasks",
                f"the tasks' node ranges hold {counts} counts together, more than the limit of "
                f"{MAX_COUNTS}",
            )
        return self

    @model_validator(mode="after")
    def _work_known(self) -> AllocationProblem:
        if self.objective in _BALANCING:
            for i, t in enumerate(self.tasks):
                if t.remaining_work is None:
                    raise _field_error(
                        f"tasks[{i}].remaining_work", f"the {self.objective} objective needs it"
                    )
        return self

    @property
    def capacity(self) -> int:
        """Nodes the tasks may share: the free ones plus the ones they hold."""
        return self.free_nodes + sum(t.current_nodes for t in self.tasks)

    @cached_property
    def domain_size(self) -> int:
        """Node counts the tasks may be given, all together: the rows of the gain tables."""
        cap = self.capacity
        return sum(1 + max(0, min(t.max_nodes, cap) - t.min_nodes + 1) for t in self.tasks)

    @property
    def exact_work(self) -> int:
        """Cell updates of the exact program: counts × the capacity it can fill."""
        fill = min(self.capacity, sum(min(t.max_nodes, self.capacity) for t in self.tasks))
        return self.domain_size * (fill + 1)

    @property
    def caps_remaining_work(self) -> bool:
        """Whether gains stop at each task's remaining work: always under ``remaining_work``;
        with ``cap_at_remaining_work``, while no task waits. A task that ends within T_fwd then
        leaves its nodes to the running tasks, which the other gains already count; while one
        waits, it leaves its nodes and slot to that one, whose gain its own past its end
        stands for, unless that successor's start costs as much as the tasks are long
        (``cap_while_waiting``; docs/policy-selection.md, "The remaining-work cap")."""
        return caps_remaining_work(
            self.objective is Objective.REMAINING_WORK,
            self.cap_at_remaining_work,
            self.cap_while_waiting,
            self.tasks_waiting,
        )

    @cached_property
    def largest_need_node_s(self) -> float:
        """The most node-seconds any task still needs (tasks of unknown work left out)."""
        return max((t.need_node_s or 0.0 for t in self.tasks), default=0.0)

    @classmethod
    def from_dict(cls, data: Any) -> AllocationProblem:
        """Validate plain data (e.g. an instance JSON); errors name the offending field."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise AllocationInputError.from_validation(exc) from None


class Allocation(BaseModel):
    """The allocator's answer: a node count per task id."""

    model_config = ConfigDict(frozen=True)

    status: SolveStatus
    objective: float
    counts: dict[str, int]
    solve_s: float

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "objective": self.objective,
            "counts": dict(self.counts),
            "solve_s": self.solve_s,
        }


def _field_error(field: str, message: str) -> ValueError:
    # Raised inside a model validator: pydantic reports the location of the whole model, so
    # the field name goes into the message, where AllocationInputError picks it up.
    return ValueError(f"{field}: {message}")
