"""The channel's wire format: signed JSON messages (pure, property-tested)."""

from __future__ import annotations

import hashlib
import hmac
import json
import stat
from pathlib import Path

from hypothesis import assume, given
from hypothesis import strategies as st

from parsl_bf.executor.channel import new_secret, read_secret, sign, verify, write_secret

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
