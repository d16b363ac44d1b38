"""What parsl_bf's providers share: the ``BackfillProvider`` protocol, ``PilotProvider``'s
``status()``/``cancel()``, and the batch providers' typed, documented constructors."""

from __future__ import annotations

import inspect
import typing

import pytest
from parsl.jobs.states import JobState
from parsl.providers import LocalProvider

from parsl_bf.providers import (
    BackfillProvider,
    LocalBackfillProvider,
    PBSProBackfillProvider,
    Pilot,
    SlurmBackfillProvider,
)
from parsl_bf.providers.batch import BatchBackfillProvider, shared_settings
from parsl_bf.providers.pilots import PilotProvider

BATCH = [SlurmBackfillProvider, PBSProBackfillProvider]
SHARED = [p for p in inspect.signature(BatchBackfillProvider.__init__).parameters][2:]


def test_our_providers_are_backfill_providers_and_parsls_are_not() -> None:
    for cls, emulated in (
        (LocalBackfillProvider, True),
        (SlurmBackfillProvider, False),
        (PBSProBackfillProvider, False),
    ):
        provider = cls()
        assert isinstance(provider, BackfillProvider) and isinstance(provider, PilotProvider)
        assert provider.emulated is emulated and cls.emulated is emulated
        assert provider.pilots == {}
    assert not isinstance(LocalProvider(), BackfillProvider)
    assert getattr(LocalProvider(), "emulated", False) is False


class Recorder(PilotProvider):
    """A provider whose pilots the test sets by hand; records what it is asked to end."""

    def __init__(self) -> None:
        super().__init__("recorder", status_polling_interval=7)
        self.ended: list[list[str]] = []

    def submit(self, command: str, tasks_per_node: int, job_name: str = "x") -> str:
        self._count += 1
        job_id = f"{job_name}.{self._count}"
        self.pilots[job_id] = Pilot(job_id)
        self.resources[job_id] = {"job_id": None}
        return job_id

    def _end(self, job_ids: list[str]) -> None:
        self.ended.append(list(job_ids))
        for job_id in job_ids:
            self.pilots[job_id].state, self.pilots[job_id].reason = JobState.CANCELLED, "cancelled"


def test_status_and_cancel_answer_from_the_pilot_record() -> None:
    p = Recorder()
    waiting, ended = p.submit("cmd", 1), p.submit("cmd", 1)
    p.pilots[ended].state, p.pilots[ended].reason = JobState.TIMEOUT, "preempted"
    p.resources[ended] |= {"job_stdout_path": "out", "job_stderr_path": "err"}
    first, second, unknown = p.status([waiting, ended, "nope"])
    assert (first.state, first.message, first.stdout_path) == (JobState.PENDING, None, None)
    assert (second.state, second.message) == (JobState.TIMEOUT, "preempted")
    assert (second.stdout_path, second.stderr_path) == ("out", "err")
    assert (unknown.state, unknown.message) == (JobState.UNKNOWN, "unknown job id")
    # Only live pilots are ended, each once; the answer says which this call ended.
    assert p.cancel([waiting, ended, "nope", waiting]) == [True, False, False, False]
    assert p.ended == [[waiting]]
    assert p.cancel([waiting, ended]) == [False, False] and p.ended == [[waiting]]
    assert p.status([waiting])[0].state is JobState.CANCELLED
    assert (p.label, p.status_polling_interval, p.nodes_per_block) == ("recorder", 7, 1)


@pytest.mark.parametrize("cls", BATCH)
def test_batch_constructors_list_every_shared_setting_typed(cls) -> None:
    # The YAML loader and the configuration reference read the signature and its hints.
    params = inspect.signature(cls.__init__).parameters
    hints = typing.get_type_hints(cls.__init__)
    base = typing.get_type_hints(BatchBackfillProvider.__init__)
    assert not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params.values())
    for name in SHARED:
        assert name in params, name
        assert params[name].default is not inspect.Parameter.empty, name
        assert hints[name] in (base[name], base[name] | None), name  # None: the default
    arguments = {name: object() for name in params} | {"launcher": None}
    assert list(shared_settings(arguments, launcher="L")) == SHARED
    assert shared_settings(arguments, launcher="L")["launcher"] == "L"


@pytest.mark.parametrize(
    "cls,parsl,directive",
    [
        (SlurmBackfillProvider, "SlurmProvider", "#SBATCH"),
        (PBSProBackfillProvider, "PBSProProvider", "#PBS"),
    ],
)
def test_each_batch_parameter_is_documented_once(cls, parsl: str, directive: str) -> None:
    doc = inspect.cleandoc(cls.__doc__)
    section = doc.split("Parameters\n----------\n", 1)[1]
    headers = [line for line in section.splitlines() if line and not line[0].isspace()]
    named = [n.strip() for h in headers for n in h.split(" : ")[0].split(",") if n.strip()]
    assert sorted(named) == sorted(
        p for p in inspect.signature(cls.__init__).parameters if p != "self"
    )
    assert f"As for Parsl's ``{parsl}`` (``scheduler_options`` are extra ``{directive}``" in doc
    assert "{" not in section


def test_a_batch_provider_must_take_every_shared_setting() -> None:
    with pytest.raises(TypeError, match="lacks the shared min_nodes, max_nodes"):

        class Partial(BatchBackfillProvider):
            """Takes only its own setting.

            Parameters
            ----------
            queue : str
                Where the pilots go.
            """

            parsl_provider, directive = "X", "#X"

            def __init__(self, queue: str = "q") -> None:
                raise NotImplementedError


def test_a_subclass_of_a_batch_provider_keeps_its_settings() -> None:
    class Site(SlurmBackfillProvider):  # e.g. a site's own hole discovery
        def _holes(self, now: float) -> list:
            return []

    assert (Site.parsl_provider, Site.directive) == ("SlurmProvider", "#SBATCH")
    assert Site(partition="p").partition == "p" and not Site.emulated
