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
