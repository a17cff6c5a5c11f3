"""The fork server's and agent's JSON lines: the same bytes as json, without its Python layers."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, strategies as st

from corral.wire import jsonline as _jsonline

_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)


@given(_values)
def test_dumps_is_json_dumps_compact(value: Any) -> None:
    assert _jsonline.dumps(value) == json.dumps(value, separators=(",", ":")).encode()


@given(_values)
def test_loads_round_trips(value: Any) -> None:
    assert _jsonline.loads(_jsonline.dumps(value)) == value


def test_loads_takes_what_json_takes_inside_a_value() -> None:
    assert _jsonline.loads(b'{"a": [1, 2.5, "\\u00e9"], "b": null}') == \
        {"a": [1, 2.5, "é"], "b": None}
    assert math.isnan(_jsonline.loads(b"NaN"))


@pytest.mark.parametrize("bad", [b"", b"{", b'{"a":1} x', b" {}", b"\xff", b"[1,]"])
def test_loads_refuses_anything_else_with_value_error(bad: bytes) -> None:
    with pytest.raises(ValueError, match=r"JSON|codec"):
        _jsonline.loads(bad)


def test_dumps_refuses_what_json_refuses() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        _jsonline.dumps({"a": object()})
