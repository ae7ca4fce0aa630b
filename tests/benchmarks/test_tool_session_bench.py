"""The tool-session benchmark's arithmetic: medians per side, the ratio, the table's lines."""

from bench_scripts import load

bench = load("tool_session_bench")


def test_a_row_is_the_median_of_each_side_and_the_ratio_is_replay_over_persistent():
    row = bench.row_of("tiny", 4, [0.30, 0.10, 0.20], [0.05, 0.04, 0.08], [0.02, 0.03, 0.01])
    assert (row.replay_s, row.persistent_s, row.start_s) == (0.20, 0.05, 0.02)
    assert row.ratio == 4.0
    lines = bench.table([row, bench.Row("compute", 1, 0.03, 0.09, 0.06)]).splitlines()
    assert lines[0].startswith("| workload | calls | replay s/episode | persistent s/episode |")
    assert lines[2] == "| tiny | 4 | 0.200 | 0.050 | 0.020 | 4.00x |"
    # Replay wins a one-call episode: 0.03 / 0.09.
    assert lines[3] == "| compute | 1 | 0.030 | 0.090 | 0.060 | 0.33x |"


def test_each_workload_gives_distinct_cells_whose_last_line_is_an_expression():
    for cell in bench.WORKLOADS.values():
        first, second = cell(1), cell(2)
        assert first != second and "1" in first.splitlines()[-1]
        compile(first, "<cell>", "exec")


def test_the_isolation_table_says_which_design_showed_only_the_last_calls_output():
    lines = bench.isolation_table([("a thread", True, False)]).splitlines()
    assert lines[2] == "| a thread | yes | NO |"
    # Each hostile session ends with a call printing "own" while something earlier still runs.
    for _, cells in bench.HOSTILE:
        assert "print('own')" in cells[-1] and len(cells) == 3
        for cell in cells:
            compile(cell, "<cell>", "exec")
