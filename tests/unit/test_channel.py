"""The channel's wire format: signed JSON messages, sessions with counters, the refusal log and
the derived CurveZMQ keys (pure, property-tested)."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import stat
from pathlib import Path

import pytest
import zmq
from hypothesis import assume, given
from hypothesis import strategies as st

from parsl_bf.pilot.wire import (
    AgentSession,
    RefusalLog,
    Refused,
    ServerSession,
    curve_keys,
    new_nonce,
    new_secret,
    read_secret,
    sign,
    verify,
    write_secret,
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)  # NaN != NaN: a round trip cannot compare equal
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
messages = st.dictionaries(st.text(), json_values, max_size=6)
secrets_ = st.binary(min_size=1, max_size=64)


@given(secrets_, messages)
def test_round_trip(secret: bytes, msg: dict) -> None:
    frames = sign(secret, msg)
    assert len(frames) == 2 and all(isinstance(f, bytes) for f in frames)
    assert verify(secret, frames) == msg


@given(secrets_, messages, st.data())
def test_tampered_body_is_refused(secret: bytes, msg: dict, data) -> None:
    signature, body = sign(secret, msg)
    i = data.draw(st.integers(0, len(body) - 1))
    flip = data.draw(st.integers(1, 255))
    tampered = body[:i] + bytes([body[i] ^ flip]) + body[i + 1 :]
    assert verify(secret, [signature, tampered]) is None


@given(secrets_, secrets_, messages)
def test_wrong_secret_is_refused(secret: bytes, other: bytes, msg: dict) -> None:
    assume(secret != other)
    assert verify(other, sign(secret, msg)) is None


@given(secrets_, messages)
def test_missing_or_extra_frames_are_refused(secret: bytes, msg: dict) -> None:
    signature, body = sign(secret, msg)
    for frames in ([], [signature], [body], [signature, body, b""], [b"", signature, body]):
        assert verify(secret, frames) is None


@given(secrets_, json_values)
def test_only_objects_are_messages(secret: bytes, value) -> None:
    assume(not isinstance(value, dict))
    body = json.dumps(value).encode()
    signature = hmac.new(secret, body, hashlib.sha256).hexdigest().encode()
    assert verify(secret, [signature, body]) is None  # signed, but not a JSON object
    assert verify(secret, [signature, b"\xff" + body]) is None


def test_secret_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("old")
    path.chmod(0o644)
    secret = write_secret(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_secret(path) == secret and len(secret) == 64
    assert new_secret() != new_secret()


def test_a_secret_file_others_may_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    write_secret(path)
    for mode in (0o640, 0o604, 0o620):
        path.chmod(mode)
        with pytest.raises(ValueError, match="others may read"):
            read_secret(path)


# --- sessions -------------------------------------------------------------------------------


def _handshake(secret: bytes) -> tuple[AgentSession, ServerSession]:
    """Register, welcome: both ends established (as the server does it, on a verified msg)."""
    agent = AgentSession(secret)
    register = verify(secret, agent.register({"pilot": "p", "nodes": ["n"]}))
    assert register is not None and register["nonce"] == agent.agent_nonce
    assert register["seq"] == 0 and register["from"] == "agent"
    server = ServerSession(secret, register["nonce"])
    msg, why = agent.open(server.welcome({"ping_s": 1.0}))
    assert why == "" and msg is not None and msg["ping_s"] == 1.0 and agent.established
    assert agent.id == server.id and server.id[0] != server.id[1]
    return agent, server


payloads = st.dictionaries(st.sampled_from(["key", "code", "argv", "x"]), json_values, max_size=3)


@given(secrets_, st.lists(payloads, max_size=8), st.lists(payloads, max_size=8))
def test_a_session_delivers_each_message_once_in_order(secret, ups, downs) -> None:
    agent, server = _handshake(secret)
    sent_up = [agent.seal({**m, "op": "heartbeat"}) for m in ups]
    sent_down = [server.seal({**m, "op": "ping"}) for m in downs]
    for frames, m in zip(sent_up, ups, strict=True):
        msg = verify(secret, frames)
        assert msg is not None and server.accept(msg) is None and msg["op"] == "heartbeat"
        assert {k: msg[k] for k in m} == m
    for frames in sent_down:
        msg, why = agent.open(frames)
        assert msg is not None and why == ""
    # Every one of them again, byte for byte: refused, and the counters stay where they were.
    for frames in sent_up:
        msg = verify(secret, frames)
        assert msg is not None and server.accept(msg).startswith("replayed or stale")
    for frames in sent_down:
        assert agent.open(frames)[1].startswith("replayed or stale")
    # The counters keep increasing, so no two messages are byte-identical.
    assert len({f[1] for f in sent_up}) == len(sent_up)
    assert len({f[1] for f in sent_down}) == len(sent_down)


def test_messages_of_another_session_or_direction_are_refused() -> None:
    secret = new_secret()
    agent, server = _handshake(secret)
    other_agent, other_server = _handshake(secret)
    # Another session's messages, with counters well ahead: refused both ways.
    for _ in range(3):
        late = other_agent.seal({"op": "heartbeat"})
        launch = other_server.seal({"op": "launch", "argv": ["rm", "-rf", "/"]})
    assert server.accept(verify(secret, late)) == "another session"
    assert agent.open(launch) == (None, "another session")
    # A server message reflected back to the server, an agent's to the agent.
    ping = server.seal({"op": "ping"})
    assert server.accept(verify(secret, ping)) == "wrong direction (from 'server')"
    beat = agent.seal({"op": "heartbeat"})
    assert agent.open(beat) == (None, "wrong direction (from 'agent')")
    # A counterless or forged-counter message: refused, or not verified at all.
    body = verify(secret, beat)
    del body["seq"]
    assert server.accept(body) == "no sequence number"
    tampered = json.loads(beat[1])
    tampered["seq"] += 1
    assert verify(secret, [beat[0], json.dumps(tampered).encode()]) is None
    # Both ends still take their own session's next message.
    assert server.accept(verify(secret, beat)) is None
    assert agent.open(ping)[1] == ""


def test_a_welcome_must_answer_the_agents_own_nonce() -> None:
    secret = new_secret()
    agent = AgentSession(secret)
    recorded = ServerSession(secret, new_nonce())  # a welcome of another registration
    assert agent.open(recorded.welcome({})) == (None, "welcome of another session")
    assert agent.open(recorded.seal({"op": "launch"})) == (None, "'launch' before the welcome")
    assert agent.open(sign(b"wrong", {"op": "welcome"})) == (None, "bad signature")
    assert not agent.established
    with pytest.raises(RuntimeError):
        agent.seal({"op": "heartbeat"})
    server = ServerSession(secret, agent.agent_nonce)
    welcome = server.welcome({})
    assert agent.open(welcome)[1] == "" and agent.established
    assert agent.open(welcome)[1].startswith("replayed or stale")  # a second welcome
    assert AgentSession(secret).agent_nonce != agent.agent_nonce


# --- the refusal log ------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@given(st.lists(st.tuples(st.floats(0, 0.7), st.sampled_from("abc"), st.sampled_from("xy"))))
def test_refusals_are_aggregated_not_lost(arrivals) -> None:
    clock, events = Clock(), []
    lines: list[tuple[float, str]] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append((clock.now, record.getMessage()))

    logger = logging.getLogger("test.refusals")
    logger.propagate, logger.handlers = False, [Capture()]
    refusals = RefusalLog(lambda e: events.append((clock.now, e)), logger, clock=clock)
    for gap, peer, reason in arrivals:
        clock.now += gap
        refusals.add(peer, reason)
        refusals.flush()
    clock.now += 1.0
    refusals.flush()
    # Every refusal counted once; at most one line, and one event per kind, per second.
    assert sum(e.count for _, e in events) == len(arrivals) == refusals.total
    assert all(b - a >= 1.0 for (a, _), (b, _) in zip(lines, lines[1:], strict=False))
    for kind in {(e.peer, e.reason) for _, e in events}:
        times = [t for t, e in events if (e.peer, e.reason) == kind]
        assert all(b - a >= 1.0 for a, b in zip(times, times[1:], strict=False))
    if arrivals:
        assert lines[0][1] == f"refused message from {arrivals[0][1]}: {arrivals[0][2]}"


def test_refusals_of_many_kinds_are_lumped() -> None:
    clock, events = Clock(), []
    refusals = RefusalLog(events.append, logging.getLogger("test.lumped"), clock=clock)
    for i in range(1000):
        refusals.add(f"peer{i}", "bad signature")
    clock.now += 1.0
    refusals.flush()
    assert events[0] == Refused("peer0", "bad signature", 1)
    assert len(events) <= 1 + 20 and sum(e.count for e in events) == 1000
    assert events[-1].peer == RefusalLog.OTHERS


# --- transport keys -------------------------------------------------------------------------


def test_curve_keys_are_derived_from_the_secret() -> None:
    secret = new_secret()
    keys = curve_keys(secret)
    assert keys == curve_keys(secret) and keys != curve_keys(new_secret())
    assert zmq.curve_public(keys.server_secret) == keys.server_public
    assert zmq.curve_public(keys.client_secret) == keys.client_public
    assert len({keys.server_public, keys.server_secret, keys.client_public}) == 3
    assert secret not in keys.server_secret + keys.client_secret
