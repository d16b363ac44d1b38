"""YAML configs: the shipped ones load; every mistake is one located line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from parsl.config import Config

import parsl_bf
from parsl_bf.checks import SettingError
from parsl_bf.cli import main
from parsl_bf.config import ConfigError, validate_config
from parsl_bf.executor import BackfillExecutor
from parsl_bf.providers import LocalBackfillProvider, PBSProBackfillProvider, SlurmBackfillProvider

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "tests" / "data" / "trace64"
SHIPPED_TRACE = "trace: ../tests/data/trace64"
# configs/local.yaml with the trace as an absolute path, to be written anywhere.
LOCAL = (ROOT / "configs" / "local.yaml").read_text().replace(SHIPPED_TRACE, f"trace: {TRACE}")


def test_shipped_local_config_builds_parsl_objects() -> None:
    config = parsl_bf.load_config(ROOT / "configs" / "local.yaml")
    assert isinstance(config, Config)
    (executor,) = config.executors
    assert isinstance(executor, BackfillExecutor) and executor.label == "bf"
    assert isinstance(executor.provider, LocalBackfillProvider)
    assert executor.provider.nodes == 64 and executor.provider.max_walltime_s == 1800
    # The allocator mapping under the executor is its allocation policy.
    assert config.retries == 2 and executor.allocator.tfwd == "auto"
    assert executor.controller.allocator is executor.allocator
    assert executor.checkpoint_every is None and executor.max_tasks == 10


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_every_shipped_config_builds(name: str, monkeypatch, tmp_path) -> None:
    # No shipped config needs an environment variable, nor the checkout as working directory.
    assert "${" not in (ROOT / "configs" / name).read_text()
    monkeypatch.chdir(tmp_path)
    config = parsl_bf.load_config(ROOT / "configs" / name)
    assert config.executors and all(e.provider is not None for e in config.executors)


def test_shipped_slurm_config_is_the_issue_usage() -> None:
    from parsl.launchers import SrunLauncher

    from parsl_bf.providers import SlurmBackfillProvider

    (executor,) = parsl_bf.load_config(ROOT / "configs" / "htex-slurm-backfill.yaml").executors
    provider = executor.provider
    assert isinstance(provider, SlurmBackfillProvider) and provider.partition == "backfill"
    assert (provider.min_nodes, provider.max_nodes) == (1, 4)
    assert (provider.min_walltime_s, provider.max_walltime_s) == (120, 3600)
    assert isinstance(provider.launcher, SrunLauncher)


def test_environment_variables_are_substituted_and_typed(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NODES", "3")
    monkeypatch.setenv("INIT", "true")  # a shell command, not a boolean
    text = LOCAL.replace("nodes: 64", "nodes: ${NODES}").replace(
        "grace_s: 5", "grace_s: 5\n      worker_init: ${INIT}"
    )
    (tmp_path / "c.yaml").write_text(text)
    config = validate_config(tmp_path / "c.yaml")
    assert config.executors[0].provider.nodes == 3
    assert config.executors[0].provider.worker_init == "true"


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize(
    ("old", "new", "needle", "where", "message"),
    [
        ("nodes: 64", "nodez: 64", "nodez", "executors[0].provider.nodez", "unknown key"),
        ("nodes: 64", "nodes: four", "nodes: four", "executors[0].provider.nodes", "expected int"),
        (
            "type: LocalBackfillProvider",
            "type: Nope",
            "type: Nope",
            "executors[0].provider.type",
            "unknown class 'Nope'",
        ),
        (
            "objective: speedup",
            "objective: fastest",
            "objective: fastest",
            "executors[0].allocator.objective",
            "Input should be",
        ),
        ("retries: 2", "retry: 2", "retry: 2", "retry", "unknown key"),
        (
            "nodes: 64",
            "nodes: ${UNSET_FOR_SURE}",
            "UNSET_FOR_SURE",
            "executors[0].provider.nodes",
            "UNSET_FOR_SURE is not set",
        ),
        ("grace_s: 5", "grace_s: [5", "grace_s: [5", "", "not valid YAML"),
        (  # a relative path is relative to the YAML file, here in tmp_path
            f"trace: {TRACE}",
            "trace: no-such-trace",
            "no-such-trace",
            "executors[0].provider.trace",
            "no such file or directory: {tmp}/no-such-trace (relative to the file)",
        ),
        (  # once the executor's own argument, now one of the settings the replay shares
            "    max_tasks: 10",
            "    max_tasks: 10\n    shrink_in_place: false",
            "shrink_in_place",
            "executors[0].shrink_in_place",
            "shrink_in_place is now a key of the BackfillExecutor's allocator: mapping",
        ),
        (
            "nodes: 64",
            "nodes: -3",
            "nodes: -3",
            "executors[0].provider.nodes",
            "must be at least 1, got -3",
        ),
        (
            "time_scale: 30",
            "time_scale: -30",
            "time_scale: -30",
            "executors[0].provider.time_scale",
            "must be more than 0, got -30",
        ),
        (
            "grace_s: 5",
            "grace_s: .nan",
            "grace_s: .nan",
            "executors[0].provider.grace_s",
            "must be a finite number, got nan",
        ),
        (
            "max_blocks: 3",
            "max_blocks: 3\n      min_blocks: 4",
            "min_blocks: 4",
            "executors[0].provider.min_blocks",
            "4 is more than max_blocks (3)",
        ),
        (
            'min_walltime: "00:00:20"',
            'min_walltime: "00:40:00"',
            "min_walltime",
            "executors[0].provider.min_walltime",
            "'00:40:00' is longer than max_walltime ('00:30:00')",
        ),
        (
            "objective: speedup",
            "objectiv: speedup",
            "objectiv:",
            "executors[0].allocator.objectiv",
            "unknown key (allowed: policy, objective, tfwd, time_limit, shrink_in_place, "
            "grow_in_place)",
        ),
        (
            "tfwd: auto",
            "tfwd: soon",
            "tfwd: soon",
            "executors[0].allocator.tfwd",
            "expected \"auto\" or a positive number of seconds, got 'soon'",
        ),
        (
            "time_limit: 10",
            "time_limit: .inf",
            "time_limit",
            "executors[0].allocator.time_limit",
            "Input should be a finite number",
        ),
    ],
)
def test_mistakes_name_file_line_and_path(tmp_path, old, new, needle, where, message) -> None:
    text = LOCAL.replace(old, new)
    assert text != LOCAL
    message = message.replace("{tmp}", str(tmp_path))
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        validate_config(path)
    text_error = str(info.value)
    assert "\n" not in text_error and message in text_error
    if where:
        assert text_error.startswith(f"{path}:{_line_of(text, needle)} {where}: ")
    else:
        assert text_error.startswith(f"{path}:")


def test_validate_command(tmp_path) -> None:
    parsl_bf_cmd = str(Path(sys.executable).with_name("parsl-bf"))
    ok = subprocess.run(
        [parsl_bf_cmd, "validate", "configs/local.yaml"], cwd=ROOT, capture_output=True, text=True
    )
    assert ok.returncode == 0 and "ok: executors bf" in ok.stdout
    (tmp_path / "c.yaml").write_text(LOCAL.replace("max_blocks: 3", "max_blocks: lots"))
    bad = subprocess.run(
        [parsl_bf_cmd, "validate", str(tmp_path / "c.yaml")], capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert f"c.yaml:{_line_of(LOCAL, 'max_blocks')} executors[0].provider.max_blocks" in bad.stderr


def test_every_unknown_key_error_lists_the_allowed_keys(tmp_path) -> None:
    for old, new in [("nodes: 64", "nodez: 64"), ("retries: 2", "retry: 2"), ("tfwd:", "tfwdd:")]:
        (tmp_path / "c.yaml").write_text(LOCAL.replace(old, new))
        with pytest.raises(ConfigError, match=r"unknown key.*\(allowed: [a-z_]+, [a-z_]+"):
            validate_config(tmp_path / "c.yaml")


def test_shipped_local_config_works_from_any_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # tests/data/trace64 does not exist from here
    config = validate_config(ROOT / "configs" / "local.yaml")
    trace = Path(parsl_bf.load_config(ROOT / "configs" / "local.yaml").executors[0].provider.trace)
    assert trace.is_absolute() and trace == TRACE and (trace / "nodes.csv").is_file()
    assert Path(config.executors[0].provider.trace) == TRACE
    # A relative config path is taken from the working directory, its paths from the file.
    monkeypatch.chdir(ROOT / "tests")
    config = validate_config("../configs/local.yaml")
    assert Path(config.executors[0].provider.trace) == TRACE


def test_paths_expand_variables_and_home(tmp_path, monkeypatch) -> None:
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t64").symlink_to(TRACE)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TRACES", "~/traces")
    elsewhere = tmp_path / "configs"
    elsewhere.mkdir()
    (elsewhere / "c.yaml").write_text(LOCAL.replace(f"trace: {TRACE}", "trace: ${TRACES}/t64"))
    config = validate_config(elsewhere / "c.yaml")
    assert config.executors[0].provider.trace == tmp_path / "traces" / "t64"


def test_a_trace_directory_needs_its_files(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    text = LOCAL.replace(f"trace: {TRACE}", "trace: empty")
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        validate_config(tmp_path / "c.yaml")
    assert str(info.value).startswith(
        f"{tmp_path / 'c.yaml'}:{_line_of(text, 'trace: empty')} executors[0].provider.trace: "
    )
    assert "is not a trace directory: no nodes.csv, events.csv.gz" in str(info.value)


def test_node_offset_past_the_trace(tmp_path) -> None:
    text = LOCAL.replace("node_offset: 0", "node_offset: 64")
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        validate_config(tmp_path / "c.yaml")
    where = f"{_line_of(text, 'node_offset: 64')} executors[0].provider.node_offset: "
    assert f"c.yaml:{where}64 is past the trace's 64 nodes" in str(info.value)


def test_batch_provider_settings_point_at_their_line(tmp_path) -> None:
    text = (ROOT / "configs" / "htex-slurm-backfill.yaml").read_text()
    assert "min_nodes: 1" in text
    text = text.replace("min_nodes: 1", "min_nodes: 1\n      cmd_timeout: 0")
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        validate_config(tmp_path / "c.yaml")
    where = f"c.yaml:{_line_of(text, 'cmd_timeout')} executors[0].provider.cmd_timeout: "
    assert f"{where}must be more than 0, got 0" in str(info.value)


@pytest.mark.parametrize(
    ("make", "field", "message"),
    [
        (lambda t: LocalBackfillProvider(trace=t / "missing"), "trace", "no such directory"),
        (lambda t: LocalBackfillProvider(nodes=2, min_nodes=3), "min_nodes", "more than nodes"),
        (lambda t: LocalBackfillProvider(poll_s=0), "poll_s", "must be more than 0"),
        (lambda t: LocalBackfillProvider(max_walltime="soon"), "max_walltime", "not a walltime"),
        (lambda t: LocalBackfillProvider(parallelism=2), "parallelism", "at most 1"),
        (lambda t: LocalBackfillProvider(nodes=2, hosts=[]), "hosts", "at least one"),
        (
            lambda t: LocalBackfillProvider(nodes=2, max_nodes=1, hosts=["n1"], host_command="ssh"),
            "host_command",
            "needs {host}",
        ),
        (
            lambda t: LocalBackfillProvider(nodes=2, hosts=["n1"], host_command="ssh {host}"),
            "max_nodes",
            "must be 1 with hosts",
        ),
        (lambda t: SlurmBackfillProvider(max_nodes=0), "max_nodes", "at least 1"),
        (lambda t: SlurmBackfillProvider(min_nodes=5), "min_nodes", "more than max_nodes (4)"),
        (lambda t: SlurmBackfillProvider(max_blocks=0), "max_blocks", "at least 1"),
        (lambda t: SlurmBackfillProvider(init_blocks=5), "init_blocks", "more than max_blocks"),
        (lambda t: SlurmBackfillProvider(signal_lead_s=-1), "signal_lead_s", "at least 0"),
        (lambda t: SlurmBackfillProvider(sizing="slurm"), "sizing", "not one of provider"),
        (lambda t: PBSProBackfillProvider(cpus_per_node=0), "cpus_per_node", "at least 1"),
        (
            lambda t: PBSProBackfillProvider(min_walltime="02:00:00"),
            "min_walltime",
            "longer than max_walltime",
        ),
    ],
)
def test_python_configs_get_the_constructor_checks(tmp_path, make, field, message) -> None:
    with pytest.raises(SettingError) as info:
        make(tmp_path)
    assert info.value.field == field and message in info.value.message
    assert str(info.value).startswith(f"{field}: ")


def test_validate_prints_the_allocator_of_each_backfill_executor(tmp_path, capsys) -> None:
    assert main(["validate", str(ROOT / "configs" / "local.yaml")]) == 0
    out = capsys.readouterr().out
    assert "; bf allocator {'policy': 'milp', 'objective': 'speedup_balanced'" in out
    htex = (
        "executors:\n"
        "  - type: HighThroughputExecutor\n"
        "    label: htex\n"
        "    provider:\n"
        "      type: LocalBackfillProvider\n"
        "      nodes: 2\n"
    )
    (tmp_path / "plain.yaml").write_text(htex)
    assert main(["validate", str(tmp_path / "plain.yaml")]) == 0
    out = capsys.readouterr().out
    assert out == (
        f"{tmp_path / 'plain.yaml'}: ok: executors htex "
        "(HighThroughputExecutor on LocalBackfillProvider)\n"
    )
    # The old top-level section is refused with where it goes now, not silently ignored.
    (tmp_path / "extra.yaml").write_text(htex + "allocator:\n  tfwd: 600\n")
    assert main(["validate", str(tmp_path / "extra.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'extra.yaml'}:7 allocator: " in err and "under the BackfillExecutor" in err


def test_validate_command_reports_a_range_error_on_its_line(tmp_path, capsys) -> None:
    (tmp_path / "c.yaml").write_text(LOCAL.replace("nodes: 64", "nodes: -3"))
    assert main(["validate", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"parsl-bf validate: error: {tmp_path / 'c.yaml'}:{_line_of(LOCAL, 'nodes: 64')} "
        "executors[0].provider.nodes: must be at least 1, got -3\n"
    )


def test_readme_snippet_is_the_shipped_htex_config() -> None:
    """The README's "add the provider" snippet builds, with the same fault settings as
    configs/htex-slurm-backfill.yaml (the one the loopback Slurm test runs)."""
    import re

    from parsl_bf.providers import BackfillErrorHandler, PreemptionRetries

    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Add the provider to your existing Parsl workflow") :]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    exec(compile(snippet, "README.md", "exec"), scope)
    ours = scope["config"]
    shipped = parsl_bf.load_config(ROOT / "configs" / "htex-slurm-backfill.yaml")
    for config in (ours, shipped):
        (executor,) = config.executors
        assert isinstance(executor.block_error_handler, BackfillErrorHandler)
        assert isinstance(config.retry_handler, PreemptionRetries) and config.retries >= 1
    a, b = ours.executors[0], shipped.executors[0]
    for key in ("heartbeat_period", "heartbeat_threshold"):
        assert getattr(a, key) == getattr(b, key)
    assert type(a.provider) is type(b.provider) and a.provider.partition == b.provider.partition
