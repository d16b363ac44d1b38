"""Pilot sizing: the most node-seconds of the holes within the bounds (pure, property-tested)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from parsl_bf.providers.sizing import SIZINGS, Hole, PilotRequest, size_pilot, sizing_request

windows = st.lists(st.one_of(st.none(), st.floats(0, 10_000)), min_size=0, max_size=12)


def _holes(ws) -> list[Hole]:
    return [Hole(f"n{i}", "idle", w) for i, w in enumerate(ws)]


def test_examples() -> None:
    holes = _holes([600, 300, 250, None])
    # 4 nodes x 250 s = 1000 beats 2 x 300 = 600 and 1 x 1800 (the unbounded node, capped).
    best = size_pilot(holes, 1, 4, 60, 1800)
    assert best is not None and best.nodes == 1 and best.walltime_s == 1800
    best = size_pilot(holes, 2, 4, 60, 400)
    assert best is not None and (best.nodes, best.walltime_s) == (4, 250)
    assert best.hosts == ("n3", "n0", "n1", "n2")
    # Slurm minutes: 250 s is 4 minutes; with a 30 s margin, 3.
    best = size_pilot(holes, 4, 4, 60, 400, margin_s=30, granularity_s=60)
    assert best is not None and best.walltime_s == 180
    assert size_pilot(holes, 1, 4, 700, 1800, margin_s=0).hosts == ("n3",)
    assert size_pilot(_holes([100, 100]), 3, 4, 60, 400) is None
    assert size_pilot(_holes([50, 40]), 1, 4, 60, 400) is None


@given(windows, st.integers(1, 5), st.integers(0, 5), st.floats(1, 600), st.floats(0, 3000))
def test_best_within_bounds(ws, min_nodes, extra, min_wall, more_wall) -> None:
    max_nodes, max_wall = min_nodes + extra, min_wall + more_wall
    best = size_pilot(_holes(ws), min_nodes, max_nodes, min_wall, max_wall)
    # Brute force over every subset size k of the longest-lived holes.
    ranked = sorted((float("inf") if w is None else w for w in ws), reverse=True)
    options = [
        (k * min(ranked[k - 1], max_wall), k)
        for k in range(min_nodes, min(max_nodes, len(ranked)) + 1)
        if min(ranked[k - 1], max_wall) >= min_wall
    ]
    if not options:
        assert best is None
        return
    assert best is not None
    assert min_nodes <= best.nodes <= max_nodes and min_wall <= best.walltime_s <= max_wall
    assert best.nodes * best.walltime_s == max(options)[0]
    # The pilot's nodes all stay free for its walltime.
    by_node = {f"n{i}": w for i, w in enumerate(ws)}
    assert all(by_node[h] is None or by_node[h] >= best.walltime_s for h in best.hosts)


@given(st.sampled_from(SIZINGS), windows, st.integers(1, 5), st.integers(0, 5), st.floats(60, 600))
def test_each_sizing_stays_within_the_bounds_and_ours_only_narrows(
    sizing, ws, min_nodes, extra, min_wall
) -> None:
    max_nodes, max_wall = min_nodes + extra, min_wall + 1200
    ours = size_pilot(_holes(ws), min_nodes, max_nodes, min_wall, max_wall)
    got = sizing_request(sizing, _holes(ws), min_nodes, max_nodes, min_wall, max_wall)
    if sizing == "scheduler":  # the whole range, whatever the holes: Slurm picks at the start
        assert got == PilotRequest(max_nodes, max_wall, (), min_nodes, min_wall)
        assert not got.sized_to_hole
        return
    if ours is None:
        assert got is None  # no hole fits: the pilot waits in the provider either way
        return
    assert got is not None and got.sized_to_hole
    assert (got.nodes, got.walltime_s, got.hosts) == (ours.nodes, ours.walltime_s, ours.hosts)
    assert got.min_walltime_s is None  # our walltime in both
    if sizing == "provider" or ours.nodes == min_nodes:
        assert got.min_nodes is None
    else:  # hybrid: Slurm may start it on fewer of our nodes, never fewer than min_nodes
        assert got.min_nodes == min_nodes < got.nodes


def test_a_range_request_becomes_slurm_ranges_and_a_launch_per_size(tmp_path) -> None:
    from parsl.launchers import SrunLauncher

    from parsl_bf.providers import SlurmBackfillProvider
    from parsl_bf.providers.base import Pilot
    from parsl_bf.providers.batch import _Job

    provider = SlurmBackfillProvider(sizing="scheduler", launcher=SrunLauncher())
    request = sizing_request("scheduler", [], 2, 4, 120, 3600)
    job = _Job(Pilot("p.1"), "work", 1, "parsl.bf")
    script = provider._script(job, request, tmp_path / "o", tmp_path / "e")
    directives = [line.split(" ", 1)[1] for line in script.splitlines() if line[:7] == "#SBATCH"]
    assert {"--nodes=2-4", "--time-min=2", "--time=60"} <= set(directives)
    # srun is told the task count of the size Slurm started the pilot at, one arm per size.
    for k in (2, 3, 4):
        assert f"{k})\n" in script and f"srun --ntasks {k} " in script
    assert "srun --ntasks 1 " not in script
    assert "EndTime=" in script  # the end Slurm granted, not the --time asked for
    fixed = sizing_request("provider", _holes([900, 900]), 1, 4, 60, 3600, granularity_s=60)
    script = provider._script(job, fixed, tmp_path / "o", tmp_path / "e")
    assert "#SBATCH --nodes=2\n" in script and "--time-min" not in script
    assert "case " not in script
