"""The run's accounting, the controller's role that measures it (:class:`Accounting`):
node-seconds offered and used, each task's scaling curve learnt from its step reports, the
efficiencies of docs/replay.md measured, and the status snapshot for ``parsl-bf status``."""

from __future__ import annotations

from typing import Any

from .lifecycle import E_SLACK, Progress
from .state import MEASURED_KEPT, ControllerState, ElasticTask, TaskState

__all__ = ["Accounting"]


class Accounting(ControllerState):
    """Node-seconds, scaling curves and efficiencies of the run so far. A role of
    :class:`~parsl_bf.executor.controller.Controller`, on its state
    (:class:`~parsl_bf.executor.state.ControllerState`)."""

    def _progress(self, event: Progress) -> None:
        """A fragment's step report: learn its scaling curve."""
        task = self.elastic.get(event.task)
        if task is not None and event.rate > 0:
            rates = task.measured.setdefault(event.world, [])
            rates.append(event.rate)
            del rates[:-MEASURED_KEPT]
            task.samples = max(task.samples, event.samples)
            last, task.last_reported = task.last_reported, event.samples
            if last is None or event.samples <= last:
                return
            seconds = (event.samples - last) / event.rate
            share = 1.0
            if self.shared_cores is not None and event.cpu_share is not None:
                share = min(1.0, max(event.cpu_share, 1e-3))
                task.report_node_s += seconds * event.world  # rank 0 stands for every rank
                task.report_capacity_s += seconds * event.world * share
            if event.world == 1:
                task.one_node_samples += event.samples - last
                # with a core of its own, these samples would have taken this share of the time
                task.one_node_s += seconds * share

    def node_capacity(self) -> float:
        """What a node in use was worth, of a node with a core of its own: 1 on real nodes;
        on the emulation the mean share of a core the ranks got (CPU ÷ wall seconds over the
        step reports so far, 1 before the first)."""
        wall = sum(t.report_node_s for t in self.elastic.values())
        if self.shared_cores is None or wall <= 0:
            return 1.0
        return sum(t.report_capacity_s for t in self.elastic.values()) / wall

    def account(self, now: float) -> None:
        """Add the node-seconds since the last call (call at every event and tick)."""
        if self._accounted_at is not None and now > self._accounted_at:
            dt = now - self._accounted_at
            offered = sum(len(v.hosts) for v in self.pilots.values() if not v.leaving)
            used = sum(1 for t in self.plain.values() if t.state == TaskState.RUNNING)
            for task in self.elastic.values():
                n = len(task.held())
                task.node_s += dt * n
                used += n
            self.offered_node_s += dt * offered
            self.used_node_s += dt * min(used, offered) if offered else 0.0
        self._accounted_at = now

    def efficiency(self) -> dict[str, Any]:
        """util, E_used and E_avail of the run so far: samples_j / P_j(1) as in the replay, in
        node-seconds.

        P_j(1) is task j's one-node rate averaged over time (the samples of its one-node step
        reports over their seconds), not the allocator's estimate (the median of its latest
        reports, which follows the rate of the moment). On the emulation (``shared_cores``)
        a node is worth the share of a core its ranks get, which moves with how many emulated
        nodes share the cores at the time: P_j(1) is scaled to a node with a core of its own
        (each one-node report's seconds × its rank's CPU share), and the held node-seconds
        count at the share their step reports measured (the rest of the time, start-ups and
        stops, at the run's mean share: :meth:`node_capacity`, reported as
        ``node_capacity``, what the emulation itself cost), so that a task measured at one
        node while few nodes ran is not held to that rate while many do.

        A task never run at one node has no P(1): its samples and its node-seconds are both
        left out (``unmeasured_node_s``), rather than its node-seconds counted as work of
        none. util counts every node-second. A figure above 1 + :data:`E_SLACK` cannot be
        true, and ``suspect`` says so; one above 1 by less is that noise, and ``noise`` says
        to read it as 1."""
        off, used = self.offered_node_s, self.used_node_s
        cap = self.node_capacity()
        # Held node-seconds at what the nodes were worth: their step reports' spans at their
        # ranks' CPU share, the rest of the time (start-ups, stops) at the run's mean share.
        work = unmeasured = measured = capacity_s = 0.0
        for task in self.elastic.values():
            if task.one_node_s > 0 and task.one_node_samples > 0:
                work += task.samples / (task.one_node_samples / task.one_node_s)
                rest = max(0.0, task.node_s - task.report_node_s)
                capacity_s += task.report_capacity_s + rest * cap
                measured += task.node_s
            else:
                unmeasured += task.node_s
        measured_used = max(0.0, used - unmeasured)
        if self.shared_cores is None:
            capacity_s = measured_used  # a node is a node
        else:  # plain apps' node-seconds at the mean share
            capacity_s += max(0.0, measured_used - measured) * cap
        cap_used = min(capacity_s, measured_used)
        cap_off = cap_used + max(0.0, off - used) * cap  # the idle ones at the mean share
        out: dict[str, Any] = {
            "util": used / off if off else None,
            "E_used": work / cap_used if cap_used > 0 else None,
            "E_avail": work / cap_off if cap_off > 0 else None,
            "offered_node_s": off,
            "used_node_s": used,
            "unmeasured_node_s": unmeasured,
            "node_capacity": cap,
            "p1": (
                "each task's one-node rate in this run, scaled to a node with a core of its "
                f"own by its rank's CPU share ({self.shared_cores} cores shared by the "
                "emulated nodes)"
                if self.shared_cores is not None
                else "each task's one-node rate in this run"
            ),
        }
        above = [k for k in ("util", "E_used", "E_avail") if (out[k] or 0) > 1]
        over = [k for k in above if out[k] > 1 + E_SLACK]
        if over:
            out["suspect"] = f"{', '.join(over)} above 1: not a measurement of this run"
        if near := [k for k in above if k not in over]:
            out["noise"] = (
                f"{', '.join(near)} above 1 by at most {E_SLACK}: the noise of the one-node "
                "rate, to be read as 1"
            )
        return out

    def status(self, now: float) -> dict[str, Any]:
        """``parsl-bf status``'s snapshot (:class:`~parsl_bf.executor.lifecycle.WriteStatus`)."""
        alloc = self.last_allocation
        return {
            "pilots": [
                {
                    "pilot": v.pilot,
                    "nodes": list(v.hosts),
                    "ends_in_s": None if v.ends_at is None else round(v.ends_at - now),
                    "leaving": v.leaving,
                }
                for v in self.pilots.values()
            ],
            "tasks": [
                {
                    "task": t.id,
                    "state": t.state,
                    "nodes": len(t.nodes),
                    "samples": t.samples,
                    "work": t.work,
                    "rate": _last_rate(t),
                    "metrics": t.metrics,
                }
                for t in self.elastic.values()
            ],
            "plain": {
                s: sum(1 for t in self.plain.values() if t.state == s)
                for s in ("queued", "running", "done")
            },
            "solves": self.solves,
            "last_solve_s": None if alloc is None else alloc.solve_s,
            "preemptions": self.preemptions,
            "accounting": self.efficiency(),
        }


def _last_rate(task: ElasticTask) -> float | None:
    rates = task.measured.get(len(task.nodes))
    return rates[-1] if rates else None
