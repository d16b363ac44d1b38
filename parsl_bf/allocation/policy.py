"""The allocation policy: one object, shared by the BackfillExecutor and ``parsl-bf replay``.

:class:`AllocatorSettings` is what a user sets (``allocator:`` under a BackfillExecutor in the
YAML, ``BackfillExecutor(allocator=...)``, or ``parsl-bf replay``'s flags) and it is the policy
itself: called on an :class:`~parsl_bf.allocation.AllocationProblem`, it returns the
:class:`~parsl_bf.allocation.Allocation` of its method. The MILP (Pyomo/GLPK) is the default;
``exact`` is the small exhaustive program, ``equal-share`` and ``greedy`` the original's
heuristics (:mod:`parsl_bf.allocation.heuristics`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..decisions import DEFAULT_TFWD_S, resolve_tfwd
from .errors import AllocationInputError
from .exact import solve_exact
from .heuristics import equal_share, greedy
from .milp import solve_milp
from .spec import Allocation, AllocationProblem, Objective

__all__ = [
    "DEFAULT_SETTINGS",
    "POLICIES",
    "AllocatorSettings",
    "Policy",
    "check_tfwd",
    "DEFAULT_TFWD_S",
]

Policy = Callable[[AllocationProblem], Allocation]

#: The allocation methods, by name.
POLICIES = ("milp", "exact", "equal-share", "greedy")


def check_tfwd(value: Any) -> float | str:
    """An allocation look-ahead: ``"auto"``, or a positive, finite number of seconds (a string
    from ``${VAR}`` too), as a float; else ValueError saying what is expected."""
    if value == "auto":
        return "auto"
    expected = f'expected "auto" or a positive number of seconds, got {value!r}'
    if isinstance(value, bool):  # an int to Python, but ``tfwd: true`` is a mistake
        raise ValueError(expected)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(expected) from None
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(expected)
    return seconds


class AllocatorSettings(BaseModel):
    """How the elastic allocator decides: its method, objective, look-ahead and time limit,
    and whether a running fragment is resized in place.

    The one set of defaults of every entry point: ``BackfillExecutor(allocator=...)`` and its
    :class:`~parsl_bf.executor.controller.Controller`, the YAML loader (``allocator:`` under a
    BackfillExecutor), ``parsl-bf replay``'s flags and
    :class:`~parsl_bf.replay.simulator.ReplayConfig` take their defaults from here
    (:data:`DEFAULT_SETTINGS`), by keyword."""

    # allow_inf_nan: ``time_limit: .nan`` passes ``gt=0`` (nan fails no comparison).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    policy: Literal["milp", "exact", "equal-share", "greedy"] = Field(
        "milp",
        description="The allocation method: the Pyomo/GLPK MILP, the exhaustive program (small "
        "instances), or the original's equal-share and greedy heuristics.",
    )
    # The defaults (speedup_balanced, 120 s) were chosen by cross-validation over the dev
    # week's periods and job sets, not by the figures of one setting: docs/policy-selection.md.
    objective: Objective = Field(
        Objective.SPEEDUP_BALANCED,
        description="What the allocator maximises (formulas in `parsl_bf.allocation.gains`); "
        "the default, `speedup_balanced`, was chosen by cross-validation "
        "(docs/policy-selection.md).",
    )
    tfwd: float | Literal["auto"] = Field(
        120.0,
        description='Look-ahead of each allocation, in seconds; "auto": the median length of '
        "the holes so far (the pilots' walltimes; the replayed nodes' idle periods). The "
        "default, 120 s, was chosen with the objective; use `auto` where time is scaled (the "
        "local emulation).",
    )
    time_limit: float = Field(
        10.0, gt=0, description="Time limit of the MILP solver at each decision, in seconds."
    )
    # True, as measured: a shrink in place costs 0.4 s of a ResNet-18's training, a grow
    # 0.6 s, against a restart's seconds (docs/training.md, docs/evaluation.md).
    shrink_in_place: bool = Field(
        True,
        description="With the executor's `warm_ranks`, shrink a fragment that gives back whole "
        "pilots in place: the ranks that stay train on with the state in memory, the others "
        "leave (`parsl_bf.training.resize`), with no checkpoint written or read. This is done "
        "when a pilot reaches its walltime, and when one is preempted: its ranks leave at "
        "their next step and the rest train on, as long as `min_nodes` stay "
        "(`parsl_bf.decisions.trains_on_in_place`). A task's own training loop takes it as a "
        "stop and starts again at the new size; from then on it is not asked again.",
    )
    grow_in_place: bool = Field(
        True,
        description="With the executor's `warm_ranks`, grow a fragment that keeps all of its "
        "nodes in place: joiner ranks start on the added nodes, and once they are set up the "
        "running ranks take them in at their next step and send them the state "
        "(`parsl_bf.training.resize`), with no checkpoint written or read and no rank "
        "stopped. A task's own training loop takes it as a stop and starts again at the new "
        "size; from then on it is sent no joiners.",
    )

    @field_validator("tfwd", mode="before")
    @classmethod
    def _tfwd(cls, value: Any) -> Any:
        return check_tfwd(value)

    def lookahead(self, holes: Sequence[float] = ()) -> float:
        """T_fwd in seconds (:func:`parsl_bf.decisions.resolve_tfwd`): the fixed value, or the
        median of ``holes`` (hole lengths seen so far) under ``auto``;
        :data:`DEFAULT_TFWD_S` while none is known."""
        return resolve_tfwd(self.tfwd, holes)

    def __call__(self, problem: AllocationProblem) -> Allocation:
        """The node counts this policy gives ``problem``'s tasks."""
        if self.policy == "milp":
            return solve_milp(problem, time_limit=self.time_limit)
        if self.policy == "exact":
            return solve_exact(problem)
        if self.policy == "equal-share":
            return equal_share(problem)
        if self.policy == "greedy":
            return greedy(problem)
        raise AllocationInputError("policy", f"unknown policy {self.policy!r}")


#: The defaults, once: what every entry point takes where it is not told otherwise.
DEFAULT_SETTINGS = AllocatorSettings()
