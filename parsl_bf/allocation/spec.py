"""Plain-data inputs and outputs of the allocator.

A :class:`TaskSpec` describes one elastic training task as the allocator sees it at one event;
an :class:`AllocationProblem` is one event's decision: the tasks, the free nodes and the
objective. Both are immutable and validated on construction, so every solver can trust them.
"""

from __future__ import annotations

from enum import StrEnum
from functools import cached_property
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import AllocationInputError

__all__ = ["Objective", "TaskSpec", "AllocationProblem", "Allocation", "SolveStatus"]


class Objective(StrEnum):
    """What the allocator maximises; the formulas are in :mod:`parsl_bf.allocation.gains`."""

    THROUGHPUT = "throughput"
    SPEEDUP = "speedup"
    WEIGHTED = "weighted"
    FAIR = "fair"
    REMAINING_WORK = "remaining_work"
    BALANCED = "balanced"

    @property
    def uses_remaining_work(self) -> bool:
        """Whether this objective's gains depend on each task's ``remaining_work``."""
        return self in (Objective.REMAINING_WORK, Objective.BALANCED)


class SolveStatus(StrEnum):
    OPTIMAL = "optimal"  # proven optimal (by GLPK or by the exact program)
    FEASIBLE = "feasible"  # GLPK's best incumbent at the time limit
    FALLBACK = "fallback"  # GLPK had nothing at the time limit: exact program's plan


_FROZEN = ConfigDict(frozen=True, extra="forbid", strict=False)


class TaskSpec(BaseModel):
    """One elastic training task at one allocation event.

    ``nodes``/``throughput`` are the scaling curve: samples/s at those node counts, linearly
    interpolated in between (the curve need not be concave). ``value``, when given, is the curve
    the ``throughput`` objective maximises instead of the throughput (as in the paper's
    "speedup" job sets); progress is always measured with ``throughput``.
    """

    model_config = _FROZEN

    id: str = Field(min_length=1)
    min_nodes: int = Field(ge=1, description="fewest nodes the task can run on")
    max_nodes: int = Field(ge=1, description="most nodes the task can use")
    current_nodes: int = Field(0, ge=0, description="nodes the task holds now")
    nodes: tuple[int, ...] = Field(description="breakpoints of the scaling curve, from 0")
    throughput: tuple[float, ...] = Field(description="samples/s at each breakpoint")
    value: tuple[float, ...] | None = Field(None, description="objective curve, optional")
    rescale_up_s: float = Field(0.0, ge=0, description="seconds of progress lost to a grow")
    rescale_down_s: float = Field(0.0, ge=0, description="seconds of progress lost to a shrink")
    weight: float = Field(1.0, ge=0, description="priority for the `weighted` objective")
    remaining_work: float | None = Field(None, ge=0, description="samples left to do")

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
        return v

    @field_validator("throughput", "value")
    @classmethod
    def _curve_ok(cls, v: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if v is not None and any(not (x >= 0) or x == float("inf") for x in v):
            raise ValueError("must be finite and non-negative")
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

    tasks: tuple[TaskSpec, ...]
    free_nodes: int = Field(ge=0)
    tfwd: float = Field(10.0, gt=0)
    objective: Objective = Objective.THROUGHPUT
    cap_at_remaining_work: bool = Field(
        False, description="count no gain beyond each task's remaining work (any objective)"
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
    def _work_known(self) -> AllocationProblem:
        if self.objective is Objective.BALANCED:
            for i, t in enumerate(self.tasks):
                if t.remaining_work is None:
                    raise _field_error(
                        f"tasks[{i}].remaining_work", "the balanced objective needs it"
                    )
        return self

    @property
    def capacity(self) -> int:
        """Nodes the tasks may share: the free ones plus the ones they hold."""
        return self.free_nodes + sum(t.current_nodes for t in self.tasks)

    @property
    def caps_remaining_work(self) -> bool:
        return self.cap_at_remaining_work or self.objective is Objective.REMAINING_WORK

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
