import json
import subprocess
import sys

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
