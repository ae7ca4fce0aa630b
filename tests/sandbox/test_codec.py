"""The tagged codec and frames: exact round trips, and strict rejection of anything else."""

from __future__ import annotations

import math
import os

import pytest
import sandbox_helpers  # noqa: F401  (imports the real sandbox package first)

from sandbox import _codec

VALUES = [
    None, True, False, 0, -1, 2**200, -(2**64), 0.1, -0.0, math.inf, -math.inf, 1e-310, 3 + 4j,
    "", "héllo\x00\U0001f600", "\ud800", b"", b"\x00\xff", [], [1, [2, [3]]], (), (1, "a"),
    {}, {1: "a", (2, 3): [4], "k": {5}}, set(), {1, 2}, frozenset({"x"}), {frozenset({1}): None},
]  # fmt: skip


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_round_trip_is_exact(value: object) -> None:
    back = _codec.decode_value(_codec.loads(_codec.dumps(_codec.encode_value(value))))
    assert back == value
    assert type(back) is type(value)
    if isinstance(value, float):
        assert math.copysign(1.0, back) == math.copysign(1.0, value)  # type: ignore[arg-type]


def test_nan_round_trips() -> None:
    back = _codec.decode_value(_codec.encode_value(float("nan")))
    assert isinstance(back, float) and math.isnan(back)


def test_subclasses_are_reduced_to_their_base_value() -> None:
    class Evil(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

        def __format__(self, spec: str) -> str:
            return "ff"

    class EvilStr(str):
        def __str__(self) -> str:
            return "lies"

    back = _codec.decode_value(_codec.encode_value([Evil(5), EvilStr("truth")]))
    assert back == [5, "truth"]
    assert [type(v) for v in back] == [int, str]  # type: ignore[union-attr]


def test_other_objects_are_refused() -> None:
    for value in (object(), lambda: 1, iter([]), range(3), Exception("x")):
        with pytest.raises(_codec.CodecError):
            _codec.encode_value(value)


@pytest.mark.parametrize(
    "tree",
    [
        "x",
        [],
        ["?"],
        ["i", 5],
        ["i", "zz"],
        ["f", "nope"],
        ["b", 1],
        ["l", "notalist"],
        ["S", [["l", []]]],
        ["d", [[["n"]]]],
        ["y", "***"],
        ["c", "1"],
        ["n", 1],
        ["d", [[["l", []], ["n"]]]],
        ["s", 1],
        ["i", "1" * 200_000],
    ],
    ids=repr,
)
def test_malformed_trees_are_rejected(tree: object) -> None:
    with pytest.raises(_codec.CodecError):
        _codec.decode_value(tree)


def test_depth_and_size_caps() -> None:
    deep: object = ["n"]
    for _ in range(_codec.MAX_DEPTH + 5):
        deep = ["l", [deep]]
    with pytest.raises(_codec.CodecError):
        _codec.decode_value(deep)
    nested: list[object] = []
    for _ in range(_codec.MAX_DEPTH + 5):
        nested = [nested]
    with pytest.raises(_codec.CodecError):
        _codec.encode_value(nested)
    with pytest.raises(_codec.CodecError):
        _codec.loads(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(_codec.CodecError):
        _codec.loads(b"\xff\xfe")


def test_frames_blocking_and_incremental() -> None:
    r, w = os.pipe()
    try:
        _codec.write_frame(w, b"hello")
        _codec.write_frame(w, b"")
        os.close(w)
        w = -1
        assert _codec.read_frame(r) == b"hello"
        assert _codec.read_frame(r) == b""
        assert _codec.read_frame(r) is None
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    reader = _codec.FrameReader(max_size=10)
    data = _codec.frame(b"abc") + _codec.frame(b"de")
    assert reader.feed(data[:4]) == []
    assert reader.feed(data[4:]) == [b"abc", b"de"]
    with pytest.raises(_codec.CodecError):
        reader.feed(_codec.frame(b"x" * 11))
