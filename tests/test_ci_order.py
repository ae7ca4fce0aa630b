"""The collection order for ``--dist worksteal`` (tests/ci_order.py) and its measured times."""

from pathlib import Path

from ci_order import MEASURED_S, Unit, block_sizes, worksteal_order

ROOT = Path(__file__).resolve().parents[1]


def test_each_block_opens_with_a_balanced_share_of_the_long_tests():
    # 3 workers, 12 tests; long: #11 (9 s), #0 and #1 sharing a fixture (8 s), #5 (4 s), #7 (3 s).
    long_units = [Unit((11,), 9), Unit((0, 1), 8), Unit((5,), 4), Unit((7,), 3)]
    order = worksteal_order(12, long_units, 3)
    assert sorted(order) == list(range(12))
    blocks = [order[0:4], order[4:8], order[8:12]]  # block_sizes(12, 3) == [4, 4, 4]
    # By hand: 11 -> worker 0 (9 s), (0, 1) -> worker 1 (8 s), 5 -> worker 2 (4 s), 7 -> worker 2.
    assert blocks == [[11, 2, 3, 4], [0, 1, 6, 8], [5, 7, 9, 10]]


def test_more_long_tests_than_a_block_holds_keep_every_test_once():
    # By hand: 0 (10 s) -> 0, 1 (9) -> 1, 2 (8) -> 1, 3 (7) -> 0, 4 (6) -> 0 (17 s each: the first).
    assert worksteal_order(5, [Unit((i,), 10 - i) for i in range(5)], 2) == [0, 3, 4, 1, 2]
    assert block_sizes(5, 2) == [2, 3] and block_sizes(0, 2) == [0, 0]


def test_every_measured_test_still_exists():
    for key in MEASURED_S:
        path, name = key.split("::")
        assert f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), key
