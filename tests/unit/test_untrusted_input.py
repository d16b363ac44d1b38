"""Untrusted input (issue 15): config files, checkpoints, allocation instances and replay inputs.

Every fault seen is a test: a bad file is refused with one line naming the file, the line and
the field (exit 2, no traceback), and nothing it names is run. The tests assert what happened
and in which order, never how long it took.
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import random
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from mpi4py import MPI

from parsl_bf import cli
from parsl_bf.cli import main
from parsl_bf.config import ConfigError, validate_config
from parsl_bf.training import checkpoint as ckpt
from parsl_bf.training.checkpoint import (
    CheckpointError,
    agreed_latest,
    checkpoints,
    latest,
    load,
    load_latest,
    mismatch,
    rng_state,
    save_checkpoint,
    set_rng_state,
)

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
PARSL_BF = str(Path(sys.executable).with_name("parsl-bf"))

PLAIN = """\
executors:
  - type: HighThroughputExecutor
    label: htex
    provider:
      type: LocalBackfillProvider
      nodes: 2
"""


def _one_error_line(capsys, command: str) -> str:
    """The command's only stderr line, which must be its error."""
    out = capsys.readouterr()
    lines = out.err.splitlines()
    assert len(lines) == 1, out.err
    assert lines[0].startswith(f"parsl-bf {command}: error: "), lines[0]
    assert "Traceback" not in out.err
    return lines[0].removeprefix(f"parsl-bf {command}: error: ")


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


# --- YAML configs ------------------------------------------------------------------------------

BOMB = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def test_a_yaml_alias_bomb_is_refused_at_its_first_anchor(tmp_path, capsys) -> None:
    (tmp_path / "bomb.yaml").write_text(BOMB)
    assert main(["validate", str(tmp_path / "bomb.yaml")]) == 2
    error = _one_error_line(capsys, "validate")
    assert error.startswith(f"{tmp_path / 'bomb.yaml'}:1: YAML anchors (&a) are not allowed")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("retries: &n 2\nstrategy_period: *n\n", r"c.yaml:7: YAML anchors \(&n\) are not"),
        ("retries: 2\nstrategy_period: *n\n", r"c.yaml:8: YAML aliases \(\*n\) are not"),
    ],
)
def test_anchors_and_aliases_are_refused_on_their_line(tmp_path, extra, message) -> None:
    (tmp_path / "c.yaml").write_text(PLAIN + extra)
    with pytest.raises(ConfigError, match=message):
        validate_config(tmp_path / "c.yaml")


@pytest.mark.parametrize(
    ("where", "block"),
    [
        ("retry_handler", "retry_handler:\n  type: subprocess:Popen\n  args: [touch, {m}]\n"),
        ("retry_handler", "retry_handler:\n  type: os:system\n  command: touch {m}\n"),
        ("monitoring", "monitoring:\n  type: subprocess:Popen\n  args: [touch, {m}]\n"),
    ],
)
def test_type_outside_the_config_packages_is_refused_and_runs_nothing(
    tmp_path, capsys, where, block
) -> None:
    marker = tmp_path / "MARKER"
    text = PLAIN + block.format(m=marker)
    (tmp_path / "c.yaml").write_text(text)
    assert main(["validate", str(tmp_path / "c.yaml")]) == 2
    error = _one_error_line(capsys, "validate")
    line = _line_of(text, block.splitlines()[1].strip())  # the type: line
    assert error.startswith(f"{tmp_path / 'c.yaml'}:{line} {where}.type: ")
    assert "is not in a config package" in error
    assert not marker.exists()


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        (  # a launcher where a provider goes
            "type: LocalBackfillProvider",
            "type: SimpleLauncher",
            "executors[0].provider.type",
            "'SimpleLauncher' is not a subclass of ExecutionProvider, which provider: takes",
        ),
        (  # a Parsl class, by its dotted name, of the wrong kind
            "type: LocalBackfillProvider",
            "type: parsl.config:Config",
            "executors[0].provider.type",
            "'parsl.config:Config' is not a subclass of ExecutionProvider",
        ),
        (  # a provider where an executor goes
            "type: HighThroughputExecutor",
            "type: LocalBackfillProvider",
            "executors[0].type",
            "is not a subclass of ParslExecutor, which executors: takes",
        ),
        (  # no object here: a plain parameter
            "label: htex",
            "label: htex\n    address:\n      type: parsl_bf.providers:LocalBackfillProvider",
            "executors[0].address.type",
            "'type:' makes an object only under executors, provider, launcher",
        ),
        ("type: LocalBackfillProvider", "type: 42", "executors[0].provider.type", "a class name"),
    ],
)
def test_type_takes_only_the_kind_of_class_its_key_expects(
    tmp_path, old, new, field, message
) -> None:
    text = PLAIN.replace(old, new)
    assert text != PLAIN
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        validate_config(tmp_path / "c.yaml")
    needle = new.splitlines()[-1].strip()
    assert str(info.value).startswith(f"{tmp_path / 'c.yaml'}:{_line_of(text, needle)} {field}: ")
    assert message in str(info.value)


EVIL_MODULE = """\
from pathlib import Path
Path({imported!r}).touch()  # importing this module runs this


class NotAProvider:
    def __init__(self, **kwargs):
        Path({constructed!r}).touch()
"""


def test_a_module_is_imported_only_from_a_named_package_and_never_constructed_off_kind(
    tmp_path, monkeypatch
) -> None:
    imported, constructed = tmp_path / "IMPORTED", tmp_path / "CONSTRUCTED"
    (tmp_path / "sitepkg").mkdir()
    (tmp_path / "sitepkg" / "__init__.py").write_text(
        EVIL_MODULE.format(imported=str(imported), constructed=str(constructed))
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sitepkg", raising=False)
    text = PLAIN.replace("type: LocalBackfillProvider", "type: sitepkg:NotAProvider")
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ConfigError, match="module 'sitepkg' is not in a config package"):
        validate_config(tmp_path / "c.yaml")
    assert not imported.exists()  # refused before the import
    # Named as a config package, it is imported; its class is still of the wrong kind.
    monkeypatch.setenv("PARSL_BF_CONFIG_MODULES", "othersite, sitepkg")
    with pytest.raises(ConfigError, match="'sitepkg:NotAProvider' is not a subclass of Exec"):
        validate_config(tmp_path / "c.yaml")
    assert imported.exists() and not constructed.exists()


def test_a_provider_of_a_named_package_is_built(tmp_path, monkeypatch) -> None:
    (tmp_path / "mysite").mkdir()
    (tmp_path / "mysite" / "__init__.py").write_text(
        "from parsl_bf.providers import LocalBackfillProvider\n\n\n"
        "class SiteProvider(LocalBackfillProvider):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PARSL_BF_CONFIG_MODULES", "mysite")
    text = PLAIN.replace("type: LocalBackfillProvider", "type: mysite:SiteProvider")
    (tmp_path / "c.yaml").write_text(text)
    (executor,) = validate_config(tmp_path / "c.yaml").executors
    assert type(executor.provider).__name__ == "SiteProvider"


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("executors: !!python/object/apply:os.system ['touch {m}']\n", 1, "YAML tag !!python"),
        (PLAIN + "retries: !!python/name:os.system\n", 7, "YAML tag !!python/name:os.system"),
        ("a: " + "[" * 10_000 + "]" * 10_000 + "\n", 1, "nested more than 32 deep"),
    ],
)
def test_yaml_tags_and_deep_nesting_are_refused(tmp_path, text, line, message) -> None:
    marker = tmp_path / "MARKER"
    (tmp_path / "c.yaml").write_text(text.format(m=marker) if "{m}" in text else text)
    with pytest.raises(ConfigError) as info:
        validate_config(tmp_path / "c.yaml")
    assert str(info.value).startswith(f"{tmp_path / 'c.yaml'}:{line}: ")
    assert message in str(info.value)
    assert not marker.exists()


def test_binary_and_huge_config_files_are_one_line(tmp_path, capsys, monkeypatch) -> None:
    (tmp_path / "bin.yaml").write_bytes(b"executors:\n  - \xff\xfe\x00\x01\n")
    assert main(["validate", str(tmp_path / "bin.yaml")]) == 2
    assert _one_error_line(capsys, "validate") == f"{tmp_path / 'bin.yaml'}:2: not UTF-8 text"
    monkeypatch.setattr("parsl_bf.config.MAX_CONFIG_BYTES", 64)
    (tmp_path / "big.yaml").write_text(PLAIN)
    assert main(["validate", str(tmp_path / "big.yaml")]) == 2
    assert "larger than 64 bytes" in _one_error_line(capsys, "validate")
    assert main(["validate", str(tmp_path)]) == 2  # a directory
    assert _one_error_line(capsys, "validate").startswith(f"{tmp_path}: ")


def test_every_shipped_config_still_validates(capsys) -> None:
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        assert main(["validate", str(path)]) == 0, capsys.readouterr().err
        assert ": ok: executors " in capsys.readouterr().out


# --- checkpoints -------------------------------------------------------------------------------


class _Payload:
    """Unpickled, it calls ``open(marker, "w")``: a stand-in for any code a pickle can run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _net(width: int = 4) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(3, width), torch.nn.ReLU(), torch.nn.Linear(width, 2)
    )


def _state(model: torch.nn.Module, samples: int) -> dict:
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "samples": samples,
        "steps": samples // 64,
        "rng": rng_state(),
    }


def _fits(model: torch.nn.Module):
    optimizer = torch.optim.Adam(model.parameters())
    return lambda s: mismatch(s, {"model": model, "optimizer": optimizer}, ("samples", "rng"))


def test_the_payload_is_live(tmp_path) -> None:
    """The control: pickle.loads of the payload does run it."""
    pickle.loads(pickle.dumps(_Payload(tmp_path / "CONTROL")))
    assert (tmp_path / "CONTROL").exists()


@pytest.mark.parametrize("form", ["pickle", "torch.save"])
def test_a_malicious_pickle_named_like_a_checkpoint_is_never_run(tmp_path, caplog, form) -> None:
    marker = tmp_path / "MARKER"
    d = tmp_path / "ckpt"
    save_checkpoint(d, _state(_net(), 640), 640)
    evil = d / f"ckpt-{1280:015d}.pt"
    if form == "pickle":
        evil.write_bytes(pickle.dumps({"model": _Payload(marker)}, protocol=2))
    else:
        buffer = io.BytesIO()
        torch.save({"model": _Payload(marker), "samples": 1280}, buffer)
        evil.write_bytes(buffer.getvalue())
    path, state = latest(d)
    assert path.name == f"ckpt-{640:015d}.pt" and state["samples"] == 640
    assert not marker.exists()
    assert f"skipping unreadable checkpoint {evil}" in caplog.text
    with pytest.raises(Exception):  # noqa: B017 - refused however torch words it
        load(evil)
    assert not marker.exists()


def test_a_foreign_newest_checkpoint_falls_back_to_the_older_valid_one(tmp_path, caplog) -> None:
    d = tmp_path / "ckpt"
    save_checkpoint(d, _state(_net(), 640), 640)
    save_checkpoint(d, _state(_net(width=8), 1280), 1280)  # another model: other shapes
    model = _net()
    found = agreed_latest(d, MPI.COMM_SELF, check=_fits(model))
    assert found is not None and found[1]["samples"] == 640
    assert "which does not fit: model: 0.weight: shape (8, 3) in the checkpoint" in caplog.text
    model.load_state_dict(found[1]["model"])  # what the trainer does next: it fits
    # Other keys, no model at all, a state of another kind: all skipped the same way.
    save_checkpoint(d, {**_state(torch.nn.Linear(3, 2), 1920)}, 1920)
    save_checkpoint(d, {"loop": {}, "samples": 2560, "steps": 1, "rng": rng_state()}, 2560)
    assert [p.name[5:-3] for p in checkpoints(d)] == [f"{2560:015d}", f"{1920:015d}"]
    with pytest.raises(CheckpointError, match="no readable checkpoint") as info:
        load_latest(d, check=_fits(model))
    assert "does not fit: model: not in the checkpoint" in str(info.value)
    assert "does not fit: model: keys: missing 0.weight" in str(info.value)
    # Without a check the newest loads: the check is what tells a foreign state.
    assert load_latest(d)["samples"] == 2560


def test_flipped_bytes_in_the_weights_are_caught_by_the_checksum(tmp_path, caplog) -> None:
    d = tmp_path / "ckpt"
    save_checkpoint(d, _state(_net(), 640), 640)
    newer = _state(_net(), 1280)
    path = save_checkpoint(d, newer, 1280)
    data = bytearray(path.read_bytes())
    weights = newer["model"]["0.weight"].numpy().tobytes()
    at = data.find(weights)
    assert at > 0
    data[at + 5] ^= 0x40
    path.write_bytes(bytes(data))
    # torch itself loads the damaged file without a word ...
    damaged = torch.load(path, weights_only=True)["model"]["0.weight"]
    assert not torch.equal(damaged, newer["model"]["0.weight"])
    # ... the checksum does not: the older valid checkpoint is used.
    assert load_latest(d)["samples"] == 640
    assert "checksum mismatch" in caplog.text


def test_a_checkpoint_without_a_checksum_is_skipped(tmp_path) -> None:
    d = tmp_path / "ckpt"
    save_checkpoint(d, _state(_net(), 640), 640)
    torch.save({"samples": 1280}, d / f"ckpt-{1280:015d}.pt")  # an old or foreign file
    assert load_latest(d)["samples"] == 640
    with pytest.raises(Exception, match="no checksum"):
        load(d / f"ckpt-{1280:015d}.pt")


class _Threads:
    """The collectives agreed_latest uses, for ``size`` ranks run as threads."""

    def __init__(self, size: int) -> None:
        self.size, self.slots = size, [None] * size
        self.barrier = threading.Barrier(size)

    def rank(self, rank: int):
        shared = self

        class Comm:
            size = shared.size

            def allgather(self, value):
                shared.slots[rank] = value
                shared.barrier.wait()
                out = list(shared.slots)
                shared.barrier.wait()
                return out

            def bcast(self, value, root=0):
                return self.allgather(value)[root]

        c = Comm()
        c.rank = rank
        return c


def test_ranks_agree_on_the_newest_checkpoint_every_one_can_use(tmp_path) -> None:
    d = tmp_path / "ckpt"
    for samples in (640, 1280, 1920):
        save_checkpoint(d, _state(_net(), samples), samples, keep=3)
    threads = _Threads(3)
    # Rank 1 cannot use 1920 (say, its copy is damaged), rank 2 cannot use 1920 nor 1280.
    unusable = {0: set(), 1: {1920}, 2: {1920, 1280}}

    def on_rank(rank: int):
        check = lambda s: "unusable here" if s["samples"] in unusable[rank] else None  # noqa: E731
        return agreed_latest(d, threads.rank(rank), check=check)

    with ThreadPoolExecutor(3) as pool:
        found = list(pool.map(on_rank, range(3)))
    assert [f[1]["samples"] for f in found] == [640, 640, 640]
    assert len({f[0] for f in found}) == 1
    # None usable on one rank: all raise alike, none waits for the others.
    unusable[2] = {640, 1280, 1920}
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(on_rank, r) for r in range(3)]
    for future in futures:
        with pytest.raises(CheckpointError, match="no readable checkpoint"):
            future.result()


def test_the_state_round_trips_in_weights_only_form(tmp_path) -> None:
    np.random.seed(1)
    torch.manual_seed(2)
    random.seed(3)
    state = {
        "rng": rng_state(),
        "user_state": {"sampler": {"order": np.arange(7), "seen": np.int64(3)}},
        "history": [{"samples": 64, "loss": 0.5}],
        "scaler": torch.amp.GradScaler("cpu").state_dict(),
    }
    expected = (np.random.rand(), random.random(), float(torch.rand(1)))
    path = save_checkpoint(tmp_path, state, 64)
    raw = torch.load(path, weights_only=True)  # loads as plain data
    assert raw["parsl_bf"]["format"] == ckpt.FORMAT and len(raw["parsl_bf"]["sha256"]) == 64
    back = load(path)
    assert isinstance(back["user_state"]["sampler"]["order"], np.ndarray)
    assert back["user_state"]["sampler"]["order"].tolist() == list(range(7))
    assert back["user_state"]["sampler"]["seen"] == 3 and "parsl_bf" not in back
    set_rng_state(back["rng"])
    assert (np.random.rand(), random.random(), float(torch.rand(1))) == expected


def _broadcast(state: dict) -> dict:
    """What a joiner ends with: the form as its Bcast fills it, then each tensor's bytes
    copied into the tensors it allocated, as the tensor Bcasts do."""
    form, sent = ckpt.state_parts(state)
    back, received = ckpt.state_from_parts(bytearray(form))
    assert [r.size for r in received] == [s.size for s in sent]
    for r, s in zip(received, sent, strict=True):
        r[:] = s
    return back


def test_the_state_a_grow_broadcasts_round_trips_and_never_runs_a_pickle(tmp_path) -> None:
    model = _net(1024)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "user_state": {
            "order": np.arange(5),
            "odd": [torch.tensor(3), torch.zeros(0), torch.ones(3, dtype=torch.bfloat16)],
            "kept": (torch.arange(4), torch.eye(2).to_sparse()),  # in the form, not as bytes
        },
        "samples": 64,
    }
    form, sent = ckpt.state_parts(state)
    # The tensors' bytes travel apart from the form, which is small.
    assert len(sent) == len(model.state_dict()) + len(opt.state_dict()["state"]) + 3
    assert len(form) < sum(s.nbytes for s in sent) / 4
    back = _broadcast(state)
    assert back["samples"] == 64 and back["user_state"]["order"].tolist() == list(range(5))
    for name, tensor in model.state_dict().items():
        assert torch.equal(back["model"][name], tensor)
    for i, slot in opt.state_dict()["state"].items():
        assert torch.equal(
            back["optimizer"]["state"][i]["momentum_buffer"], slot["momentum_buffer"]
        )
    odd, kept = back["user_state"]["odd"], back["user_state"]["kept"]
    assert odd[0].item() == 3 and odd[0].dim() == 0 and odd[1].shape == (0,)
    assert odd[2].dtype == torch.bfloat16 and odd[2].tolist() == [1.0, 1.0, 1.0]
    assert torch.equal(kept[0], torch.arange(4)) and torch.equal(kept[1].to_dense(), torch.eye(2))
    # The sender's state is left as it was.
    assert isinstance(state["model"]["0.weight"], torch.Tensor)
    forged = io.BytesIO()
    torch.save({"model": _Payload(tmp_path / "M")}, forged)
    with pytest.raises(pickle.UnpicklingError):
        ckpt.state_from_parts(forged.getvalue())
    assert not (tmp_path / "M").exists()


def test_a_state_form_with_a_tensor_out_of_place_is_refused() -> None:
    meta = torch.empty(2, device="meta")
    for form in (
        {"form": {"a": 1}, "places": [(("a",), meta)]},  # a place that holds a value
        {"form": {"a": None}, "places": [(("b", "c"), meta)]},  # a place that is not there
        {"form": {"a": None}, "places": [((), meta)]},
        {"form": {"a": (None,)}, "places": [(("a", 0), meta)]},  # a tuple holds none
        {"form": {"a": None}, "places": [("a",)]},
        [1, 2],
    ):
        buffer = io.BytesIO()
        torch.save(form, buffer)
        with pytest.raises(ValueError, match="form"):
            ckpt.state_from_parts(buffer.getvalue())


def test_a_state_that_cannot_load_weights_only_is_refused_when_saving(tmp_path) -> None:
    with pytest.raises(TypeError, match=r"checkpoint state\['user_state'\]\['x'\]: a .*_Payload"):
        save_checkpoint(tmp_path, {"user_state": {"x": _Payload(tmp_path / "M")}}, 64)
    assert checkpoints(tmp_path) == [] and not list(tmp_path.iterdir())


# --- parsl-bf solve ----------------------------------------------------------------------------


def _instance(**changes) -> dict:
    data = json.loads((ROOT / "examples" / "instance.json").read_text())
    task = changes.pop("task1", {})
    data["tasks"][1].update(task)
    data.update(changes)
    return data


def _field_line(text: str, field: str) -> int:
    """The line of ``free_nodes`` or ``tasks[1].throughput[2]`` in an instance written with
    indent=1 (one key, one list element a line), found by reading it as a person would."""
    lines = text.splitlines()
    if not field.startswith("tasks[1]."):
        return _line_of(text, json.dumps(field))
    key, _, index = field.removeprefix("tasks[1].").partition("[")
    start = _line_of(text, '"alexnet-b"')
    at = next(i for i in range(start, len(lines) + 1) if f'"{key}":' in lines[i - 1])
    return at + 1 + int(index.rstrip("]")) if index else at


def _solve(tmp_path, capsys, text: str, *flags: str) -> tuple[Path, str]:
    path = tmp_path / "i.json"
    path.write_text(text)
    assert main(["solve", str(path), *flags]) == 2
    return path, _one_error_line(capsys, "solve")


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"tfwd": float("inf")}, "tfwd", "finite number"),
        ({"tfwd": float("nan")}, "tfwd", "finite number"),
        ({"task1": {"throughput": [0, 1, float("nan"), 3, 4]}}, "tasks[1].throughput[2]", "finite"),
        ({"task1": {"rescale_up_s": float("inf")}}, "tasks[1].rescale_up_s", "finite number"),
        ({"task1": {"weight": float("inf")}}, "tasks[1].weight", "finite number"),
        ({"task1": {"remaining_work": float("inf")}}, "tasks[1].remaining_work", "finite"),
        ({"tfwd": 1e300}, "tfwd", "less than or equal to"),  # finite, but the gains overflow
    ],
)
def test_non_finite_numbers_are_refused(tmp_path, capsys, changes, field, message) -> None:
    text = json.dumps(_instance(**changes), indent=1)  # NaN and Infinity, as Python writes them
    path, error = _solve(tmp_path, capsys, text)
    assert error.startswith(f"{path}:{_field_line(text, field)} {field}: "), error
    assert message in error


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"task1": {"max_nodes": 1e8}}, "tasks[1].max_nodes", "less than or equal to 100000"),
        ({"free_nodes": 10**8}, "free_nodes", "less than or equal to 100000"),
        ({"task1": {"nodes": [0, 1, 2, 4, 10**8]}}, "tasks[1].nodes", "limit of 100000 nodes"),
        ({"task1": {"throughput": [0, 1, 2, 3, 1e300]}}, "tasks[1].throughput", "at most 1e+12"),
    ],
)
def test_huge_sizes_are_refused(tmp_path, capsys, changes, field, message) -> None:
    text = json.dumps(_instance(**changes), indent=1)
    path, error = _solve(tmp_path, capsys, text)
    assert error.startswith(f"{path}:{_field_line(text, field)} {field}: "), error
    assert message in error


def _wide(tasks: int, nodes: int, free: int) -> dict:
    curve = {"nodes": [0, 1, nodes], "throughput": [0, 10, 5 * nodes]}
    return {
        "tfwd": 10,
        "free_nodes": free,
        "tasks": [
            {"id": f"t{i}", "min_nodes": 1, "max_nodes": nodes, **curve} for i in range(tasks)
        ],
    }


def test_the_tasks_node_ranges_together_are_bounded(tmp_path, capsys) -> None:
    path, error = _solve(tmp_path, capsys, json.dumps(_wide(60, 100_000, 100_000)))
    assert error.startswith(f"{path}:1 tasks: the tasks' node ranges hold 6000060 counts")
    # Within the limits, the exact program's work is bounded too; the MILP takes it.
    path, error = _solve(
        tmp_path, capsys, json.dumps(_wide(8, 100_000, 100_000)), "--solver", "exact"
    )
    assert error.startswith(f"{path}: too large for the exact program") and "--solver milp" in error


def test_many_tasks_are_refused(tmp_path, capsys) -> None:
    from parsl_bf.allocation.spec import MAX_TASKS

    data = _wide(MAX_TASKS + 1, 2, 2)
    path, error = _solve(tmp_path, capsys, json.dumps(data))
    assert error.startswith(f"{path}:1 tasks: ") and "at most 10000 items" in error


def test_deep_binary_and_huge_instance_files_are_one_line(tmp_path, capsys, monkeypatch) -> None:
    path, error = _solve(tmp_path, capsys, "[" * 100_000 + "]" * 100_000)
    assert error == f"{path}: not JSON: nested too deeply"
    path, error = _solve(tmp_path, capsys, '{\n"tfwd": 10,\n"tasks": [\x00]}')
    assert error.startswith(f"{path}:3: not JSON: ")
    (tmp_path / "i.json").write_bytes(b'{"tfwd": \xff}')
    assert main(["solve", str(tmp_path / "i.json")]) == 2
    assert _one_error_line(capsys, "solve") == f"{tmp_path / 'i.json'}:1: not UTF-8 text"
    path, error = _solve(tmp_path, capsys, '{"tfwd": ' + "9" * 5000 + "}")
    assert error.startswith(f"{path}: not JSON: ") and "digits" in error
    monkeypatch.setattr(cli, "MAX_INSTANCE_BYTES", 100)
    path, error = _solve(tmp_path, capsys, json.dumps(_instance()))
    assert error == f"{path}: larger than 100 bytes: not an allocation instance"


@pytest.mark.parametrize("limit", ["inf", "nan", "-1", "1e9"])
def test_the_time_limit_must_be_finite(tmp_path, capsys, limit) -> None:
    _, error = _solve(tmp_path, capsys, json.dumps(_instance()), "--time-limit", limit)
    assert error.startswith("--time-limit: expected 0 to 86400 seconds")


def test_deep_json_is_one_line_from_the_installed_command(tmp_path) -> None:
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    proc = subprocess.run(
        [PARSL_BF, "solve", str(tmp_path / "deep.json")], capture_output=True, text=True
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert (
        proc.stderr
        == f"parsl-bf solve: error: {tmp_path / 'deep.json'}: not JSON: nested too deeply\n"
    )


# --- parsl-bf replay ---------------------------------------------------------------------------


def _trace(tmp_path: Path) -> Path:
    d = tmp_path / "trace"
    if not d.exists():
        shutil.copytree(DATA / "trace64", d)
    return d


def _replay(capsys, trace: Path, jobs: Path, *flags: str) -> str:
    args = ["replay", "--trace", str(trace), "--jobs", str(jobs), "--tfwd", "60", *flags]
    assert main([*args, "--out", str(trace.parent / "out")]) == 2
    assert not (trace.parent / "out").exists()  # refused before any replay
    return _one_error_line(capsys, "replay")


JOBS = DATA / "hps-shufflenet-10J.json"
JOBS_CSV = DATA / "hps-shufflenet-10J.csv"


def _events(tmp_path: Path, *rows: str, raw: bytes | None = None) -> Path:
    d = _trace(tmp_path)
    if raw is not None:
        (d / "events.csv.gz").write_bytes(raw)
    else:
        with gzip.open(d / "events.csv.gz", "wt") as f:
            f.write("t_s,node,state\n" + "".join(r + "\n" for r in rows))
    return d


def test_a_truncated_gzip_trace(tmp_path, capsys) -> None:
    d = _trace(tmp_path)
    whole = (d / "events.csv.gz").read_bytes()
    (d / "events.csv.gz").write_bytes(whole[: len(whole) // 2])
    error = _replay(capsys, d, JOBS)
    assert error.startswith(f"{d / 'events.csv.gz'}:")
    assert "not a readable gzip file (truncated" in error


def test_random_bytes_as_a_gzip_trace(tmp_path, capsys) -> None:
    d = _events(tmp_path, raw=np.random.default_rng(0).bytes(4096))
    error = _replay(capsys, d, JOBS)
    assert error.startswith(f"{d / 'events.csv.gz'}:1: not a readable gzip file (corrupt")


def test_random_bytes_after_a_gzip_header(tmp_path, capsys) -> None:
    body = np.random.default_rng(1).bytes(4096)
    d = _events(tmp_path, raw=gzip.compress(b"t_s,node,state\n")[:10] + body)
    error = _replay(capsys, d, JOBS)
    assert error.startswith(f"{d / 'events.csv.gz'}:1: not a readable gzip file")


def test_binary_csv(tmp_path, capsys) -> None:
    d = _trace(tmp_path)
    (d / "nodes.csv").write_bytes(b"node,col_index\n" + bytes(range(256)) * 4)
    error = _replay(capsys, d, JOBS)
    assert error == f"{d / 'nodes.csv'}:2: not text: a NUL byte"
    (d / "nodes.csv").write_bytes(b"node,col_index\nc05n06,0\na\x00b,1\n")
    error = _replay(capsys, d, JOBS)
    assert error == f"{d / 'nodes.csv'}:3: not text: a NUL byte"
    jobs = tmp_path / "jobs.csv"
    jobs.write_bytes(JOBS_CSV.read_bytes()[:300] + b"\xff\xfe\x01\x02" * 50)
    shutil.copy(DATA / "trace64" / "nodes.csv", d / "nodes.csv")
    assert _replay(capsys, d, jobs) == f"{jobs}:2: not UTF-8 text"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("c05n06,x,1,0,0", "col_index: not an integer: 'x'"),
        ("c05n06,-1,1,0,0", "col_index: not an integer: '-1'"),
        ("c05n06,1e3,1,0,0", "col_index: not an integer: '1e3'"),
        ("c05n06,,1,0,0", "col_index: not an integer: ''"),
        ("c05n06", "col_index: not an integer: None"),
        ("zz01,0,1,0,0", "col_index: duplicate col_index 0 (also line 2)"),
    ],
)
def test_bad_col_index(tmp_path, capsys, row, message) -> None:
    d = _trace(tmp_path)
    lines = (d / "nodes.csv").read_text().splitlines()
    lines.insert(2, row)
    if message.startswith("col_index: not"):
        lines[1:2] = []  # the bad row is the only c05n06, on line 2
    (d / "nodes.csv").write_text("\n".join(lines) + "\n")
    error = _replay(capsys, d, JOBS)
    line = 2 if message.startswith("col_index: not") else 3
    assert error == f"{d / 'nodes.csv'}:{line} {message}"


def test_a_duplicate_node(tmp_path, capsys) -> None:
    d = _trace(tmp_path)
    lines = (d / "nodes.csv").read_text().splitlines()
    name = lines[5].split(",")[0]
    lines.append(f"{name},999,1,0,0")
    (d / "nodes.csv").write_text("\n".join(lines) + "\n")
    error = _replay(capsys, d, JOBS)
    assert error == f"{d / 'nodes.csv'}:{len(lines)} node: duplicate node {name!r} (also line 6)"


@pytest.mark.parametrize(
    ("meta", "line", "message"),
    [
        ("{not json", 1, ": not JSON: "),
        ("[604800]", 1, ": expected a JSON object, got list"),
        ('{"n_nodes": 64}', 1, " end_s: missing"),
        ('{\n  "end_s": "soon"\n}', 2, " end_s: not an integer: 'soon'"),
        ('{\n  "end_s": 1e23\n}', 2, " end_s: 1e+23 is more than the limit of 3.1536e+08"),
        ('{\n  "end_s": NaN\n}', 2, " end_s: not an integer: nan"),
        ('{\n  "end_s": 1000\n}', 2, " end_s: 1000 is before the last event (604205 s)"),
        ('{"end_s": ' + "[" * 100_000 + "]" * 100_000 + "}", None, ": not JSON: nested too deeply"),
        ("\xff", 1, ": not JSON: "),
    ],
)
def test_bad_meta_json(tmp_path, capsys, meta, line, message) -> None:
    d = _trace(tmp_path)
    (d / "meta.json").write_text(meta)
    error = _replay(capsys, d, JOBS)
    where = f"{d / 'meta.json'}" + (f":{line}" if line else "")
    assert error.startswith(where + message), error


@pytest.mark.parametrize(
    ("rows", "line", "message"),
    [
        (["0,c05n06,idle", "100000000000000000000000,c05n06,busy"], 3, "t_s: not an integer"),
        (["0,c05n06,idle", "400000000,c05n06,busy"], 3, "t_s: '400000000' is more than the limit"),
        (["0,c05n06,idle", "1e23,c05n06,busy"], 3, "t_s: not an integer: '1e23'"),
        (["0,c05n06,idle", "nan,c05n06,busy"], 3, "t_s: not an integer: 'nan'"),
        (["0,c05n06"], 2, "state: None is not idle/busy"),
    ],
)
def test_bad_event_times(tmp_path, capsys, rows, line, message) -> None:
    d = _events(tmp_path, *rows)
    error = _replay(capsys, d, JOBS)
    assert error.startswith(f"{d / 'events.csv.gz'}:{line} {message}"), error


def _job_set(tmp_path: Path, change) -> tuple[Path, str]:
    data = json.loads(JOBS.read_text())
    change(data)
    text = json.dumps(data, indent=1)
    (tmp_path / "jobs.json").write_text(text)
    return tmp_path / "jobs.json", text


def _set(index: int, key: str, value):
    return lambda data: data["jobs"][index].__setitem__(key, value)


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        (lambda data: data.__setitem__("jobs", None), "jobs", "expected a list of jobs, got None"),
        (lambda data: data.__setitem__("jobs", {}), "jobs", "expected a list of jobs, got {}"),
        (lambda data: data["jobs"].__setitem__(3, 7), "jobs[3]", "expected an object, got 7"),
        (_set(4, "job", "J00001"), "jobs[4].job", "duplicate job id 'J00001' (also jobs[1], line"),
        (_set(2, "submit_window_s", float("nan")), "jobs[2].submit_window_s", "not a finite"),
        (_set(2, "submit_window_s", -5), "jobs[2].submit_window_s", "-5 is less than 0"),
        (_set(2, "submit_window_s", 1e23), "jobs[2].submit_window_s", "more than the limit"),
        (_set(2, "total_work_samples", float("inf")), "jobs[2].total_work_samples", "finite"),
        (_set(2, "total_work_samples", 0), "jobs[2].total_work_samples", "must be positive"),
        (_set(2, "total_work_samples", 1e300), "jobs[2].total_work_samples", "at most 1e+18"),
        (_set(2, "rescale_up_s", float("inf")), "jobs[2].rescale_up_s", "finite number"),
        (_set(2, "jmin", 1.5), "jobs[2].jmin", "not an integer: 1.5"),
        (_set(2, "jmax", True), "jobs[2].jmax", "not an integer: True"),
        (_set(2, "nodes", "0,1,2"), "jobs[2].nodes", "expected a list, got str"),
        (_set(2, "job", None), "jobs[2].job", "missing"),
        (
            _set(2, "throughput", [0, 1, 2, 3, 4, 5, 6, float("nan")]),
            "jobs[2].throughput",
            "finite",
        ),
        (_set(2, "jmax", 10**9), "jobs[2].jmax", "less than or equal to 100000"),
    ],
)
def test_bad_job_sets(tmp_path, capsys, change, field, message) -> None:
    path, text = _job_set(tmp_path, change)
    error = _replay(capsys, _trace(tmp_path), path)
    assert error.startswith(f"{path}:") and f" {field}: " in error and message in error, error
    line = text.splitlines()[int(error[len(str(path)) + 1 :].split(" ")[0]) - 1]
    if field == "jobs[3]":  # the entry itself
        assert line.strip() == "7,"
    else:  # the line of the field's own key
        assert f'"{field.rsplit(".", 1)[-1]}":' in line, line


def test_a_duplicate_job_id_in_a_csv_set(tmp_path, capsys) -> None:
    rows = JOBS_CSV.read_text().splitlines()
    rows.append(rows[3])
    (tmp_path / "jobs.csv").write_text("\n".join(rows) + "\n")
    error = _replay(capsys, _trace(tmp_path), tmp_path / "jobs.csv")
    assert (
        error == f"{tmp_path / 'jobs.csv'}:{len(rows)} job: duplicate job id 'J00002' (also line 4)"
    )


def test_a_not_a_number_submit_time_in_a_csv_set(tmp_path, capsys) -> None:
    rows = JOBS_CSV.read_text().splitlines()
    rows[2] = rows[2].replace(",4000,", ",nan,", 1)
    (tmp_path / "jobs.csv").write_text("\n".join(rows) + "\n")
    error = _replay(capsys, _trace(tmp_path), tmp_path / "jobs.csv")
    assert error == f"{tmp_path / 'jobs.csv'}:3 submit_window_s: not a finite number: 'nan'"


@pytest.mark.parametrize(
    ("log", "message"),
    [
        ("; MaxNodes: 4\n1 inf 0 100 2 -1 -1 2\n", ":2 fields 2-5, 8: not a finite number: 'inf'"),
        ("; MaxNodes: 4\n1 0 0 1e23 2 -1 -1 2\n", ":2 fields 2-5, 8: '1e23' is more than"),
        ("; MaxNodes: many\n1 0 0 100 2 -1 -1 2\n", ":1 MaxNodes: not an integer: 'many'"),
        ("; MaxNodes: 10000000\n1 0 0 100 2 -1 -1 2\n", ":1 MaxNodes: '10000000' is more than"),
        ("; MaxNodes: 4\n1 0 0 100 2 -1 -1 \x00\n", ":2: not text: a NUL byte"),
        ("; MaxNodes: 4\n1 0 0 100 2 -1 -1 x\n", ":2 fields 2-5, 8: not a number: 'x'"),
    ],
)
def test_bad_swf_logs(tmp_path, capsys, log, message) -> None:
    (tmp_path / "log.swf").write_text(log)
    args = ["replay", "--swf", str(tmp_path / "log.swf"), "--jobs", str(JOBS), "--tfwd", "60"]
    assert main([*args, "--out", str(tmp_path / "out")]) == 2
    error = _one_error_line(capsys, "replay")
    assert error.startswith(f"{tmp_path / 'log.swf'}{message}"), error


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-jobs", "0"], "--max-jobs: expected 1 to 10000, got 0"),
        (["--nodes", "-3"], "--nodes: expected 1 to 100000, got -3"),
        (["--node-offset", "-1"], "--node-offset: expected 0 to 100000, got -1"),
    ],
)
def test_bad_replay_flags(tmp_path, capsys, flags, message) -> None:
    assert _replay(capsys, _trace(tmp_path), JOBS, *flags) == message


@pytest.mark.parametrize("flag", ["--preemption-shrink-s", "--rescale-in-place-s"])
@pytest.mark.parametrize("value", ["-1", "nan", "inf", "abc"])
def test_bad_replay_costs(tmp_path, capsys, flag, value) -> None:
    # Seconds >= 0 or none; argparse's usage line, then one error line naming the flag.
    with pytest.raises(SystemExit) as exit_:
        main(["replay", "--trace", str(_trace(tmp_path)), "--jobs", str(JOBS), flag, value])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.endswith(f"argument {flag}: {value!r}: expected seconds >= 0, or none")


def test_an_all_busy_trace_needs_an_explicit_tfwd(tmp_path, capsys) -> None:
    d = _events(tmp_path, "0,c05n06,busy")
    (d / "meta.json").write_text('{"end_s": 3600}')
    args = ["replay", "--trace", str(d), "--jobs", str(JOBS), "--out", str(tmp_path / "out")]
    assert main([*args, "--tfwd", "auto"]) == 2
    assert _one_error_line(capsys, "replay") == (
        f"{d}: no complete hole in the window: give T_fwd explicitly (--tfwd)"
    )


def test_garbled_replay_input_is_one_line_from_the_installed_command(tmp_path) -> None:
    d = _events(tmp_path, raw=b"\x1f\x8b" + np.random.default_rng(2).bytes(512))
    proc = subprocess.run(
        [PARSL_BF, "replay", "--trace", str(d), "--jobs", str(JOBS), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"parsl-bf replay: error: {d / 'events.csv.gz'}:1: not a ")
