import json
import subprocess
import sys

import pytest

import grpo_envs
from grpo_envs.cli import main


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "math/gsm8k-v0" in out and "rg/<task>-v0" in out


def test_show(capsys):
    assert main(["show", "math/add2-v0", "--kwargs", '{"train_size": 7, "test_size": 3}']) == 0
    out = capsys.readouterr().out
    assert "split train: 7 rows" in out and "split test: 3 rows" in out and "What is" in out


def test_unknown_id_exit_code(capsys):
    assert main(["show", "math/add3-v0"]) == 2
    assert "math/add2-v0" in capsys.readouterr().err


def test_score_file(tmp_path, capsys):
    kwargs = '{"train_size": 5, "test_size": 4}'
    env = grpo_envs.make("math/add2-v0", train_size=5, test_size=4)
    rows = list(env.dataset("test"))
    lines = [
        {"id": rows[0]["id"], "completion": f"\\boxed{{{rows[0]['answer']}}}"},
        {"id": rows[1]["id"], "completion": "\\boxed{0}"},
        {"id": rows[2]["id"], "completion": "no answer"},
        {"completion": f"<answer>{rows[3]['answer']}</answer>", "sample": rows[3]},
    ]
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    out_path = tmp_path / "out" / "scores.jsonl"
    assert (
        main(
            [
                "score",
                "math/add2-v0",
                "--kwargs",
                kwargs,
                "--completions",
                str(path),
                "--out",
                str(out_path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "accuracy 0.5000" in out and "correct" in out and "unparsable" in out
    written = [json.loads(x) for x in out_path.read_text().splitlines()]
    assert [w["outcome"] for w in written] == ["correct", "wrong", "unparsable", "correct"]
    assert written[0]["id"] == rows[0]["id"]


def test_score_bad_line(tmp_path, capsys):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "x"}\n')
    assert main(["score", "math/add2-v0", "--completions", str(path)]) == 2
    assert "completion" in capsys.readouterr().err


def test_cli_does_not_import_torch():
    code = (
        "import sys; from grpo_envs.cli import main; main(['list']); "
        "main(['show', 'math/countdown-v0', '--kwargs', '{\"train_size\": 2, \"test_size\": 2}']); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def test_score_exits_nonzero_and_says_why_for_a_row_it_cannot_score(tmp_path, capsys):
    path = tmp_path / "completions.jsonl"
    rows = [
        {"sample": {"id": "a", "prompt": [{"role": "user", "content": "2+2?"}], "answer": "4"},
         "completion": "\\boxed{4}"},
        {"sample": {"id": "b", "prompt": [{"role": "user", "content": "2+3?"}], "answer": "5"},
         "completion": None},
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = main(["score", "math/add2-v0", "--completions", str(path)])
    captured = capsys.readouterr()
    assert code == 1
    assert "line 2" in captured.err and "'b'" in captured.err
    assert "could not be scored:" in captured.err


def test_show_of_a_hub_dataset_offline_fails_fast_with_the_fix(tmp_path):
    import os
    import subprocess
    import sys
    import time

    # An endpoint nothing listens on stands for "no network"; an empty cache for a fresh machine.
    env = {
        **os.environ,
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_DATASETS_CACHE": str(tmp_path / "hf" / "datasets"),
    }
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "GRPO_GSM8K_DIR", "HTTPS_PROXY"):
        env.pop(name, None)
    grpo = os.path.join(os.path.dirname(sys.executable), "grpo")
    start = time.monotonic()
    proc = subprocess.run(
        [grpo, "envs", "show", "math/gsm8k-v0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 1
    assert "not reachable" in proc.stdout and "GRPO_GSM8K_DIR" in proc.stdout
    assert elapsed < 30  # it used to retry the hub for ~40 s per split


def test_show_lists_the_arguments_with_their_defaults(capsys):
    assert main(["show", "code/dataset-v0", "--kwargs", '{"path": "nope.jsonl"}']) == 2
    captured = capsys.readouterr()
    # the arguments come before the build, so a failed build still shows them
    assert "path (required)" in captured.out and "solution='solution'" in captured.out
    assert "question='question'" in captured.out
    assert "data file missing: " in captured.err and len(captured.err.splitlines()) == 1


def test_module_ids_are_found_in_the_current_folder(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_first_envs.py").write_text(
        "from grpo_envs import register\n"
        "register('demo/here-v0', 'grpo_envs.envs.arithmetic:ArithmeticEnv')\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        assert main(["show", "my_first_envs:demo/here-v0"]) == 0
        assert "id:          demo/here-v0" in capsys.readouterr().out
    finally:
        grpo_envs.registration.registry.pop("demo/here-v0", None)
        sys.modules.pop("my_first_envs", None)


def test_a_missing_module_is_one_line(capsys):
    assert main(["show", "no_such_module_here:demo/x-v0"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "cannot import module 'no_such_module_here'" in err


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [
        (["show", "math/add2-v0", "--kwagrs", "{}"], "--kwargs"),
        (["score", "math/add2-v0", "--completions", "x", "--splt", "test"], "--split"),
        (["list", "--namespce", "math"], "--namespace"),
    ],
)
def test_a_mistyped_flag_is_the_error_a_suggestion_and_a_hint(argv, suggestion, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and "usage" not in "\n".join(err)
    assert "unrecognized arguments" in err[0] and f"did you mean {suggestion}" in err[1]
    assert "--help" in err[2]


def test_check_says_what_it_checked_and_fails_on_a_broken_reference(tmp_path, capsys):
    kwargs = json.dumps({"train_size": 6, "test_size": 4})
    assert main(["check", "math/add2-v0", "--kwargs", kwargs]) == 0
    out = capsys.readouterr().out
    assert out.startswith("math/add2-v0: passed") and "train (6 rows), test (4 rows)" in out
    assert "determinism" in out
    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps(
            {"question": "q", "tests": ["assert f() == 1"], "solution": "def f():\n    return 2"}
        )
        + "\n"
    )
    kwargs = json.dumps({"path": str(path), "splits": "test"})
    assert main(["check", "code/dataset-v0", "--kwargs", kwargs]) == 1
    assert "check failed" in capsys.readouterr().err
