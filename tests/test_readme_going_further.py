"""The README's "Going further" commands run as written, with a tiny model and small limits.

Every ``grpo`` line of the section's bash blocks is executed through the real CLI, in a scratch
folder, with three kinds of substitution only: the hub model it names (or the embedded default)
becomes the tiny test model; each run gets small limits appended (later flags win); paths that
stand for "your run" or "your files" (``runs/grpo-default/.../step-000008``, ``eval_runs/A``,
``{...}``) become the ones the earlier commands produced.

A ``grpo train`` line whose training path another run already takes (``trained_elsewhere``) is
checked, to keep CI short, the way ``grpo train`` reads it before training: the CLI's own parser
and config layering (a bad flag or value fails there, naming the field), each flag landing in
the config, and every environment it names built with its training rows loaded.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GRPO = str(Path(sys.executable).with_name("grpo"))
HUB_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
LCB_V2 = {"version_tag": "release_v2"}
GSM8K = ROOT / "tests" / "grpo_envs" / "fixtures" / "gsm8k"


def going_further() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("## Going further", 1)[1].split("\n## ", 1)[0]


def commands() -> list[list[str]]:
    """The ``grpo`` command lines of the section, comments removed, in order."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", going_further(), re.S):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] == "grpo":
                out.append(words)
    return out


def run_yaml() -> str:
    block = re.search(r"```yaml\n(# run\.yaml.*?)```", going_further(), re.S)
    assert block is not None, "the README lost its run.yaml example"
    return block.group(1)


def trained_elsewhere(words: list[str]) -> str | None:
    """Where the training path of the ``grpo train`` line ``words`` runs for real, if elsewhere."""
    if words[:2] != ["grpo", "train"] or "--resume" in words or "--config" in words:
        return None
    if "--lora_r" in words:
        return "tests/grpo_train/test_user_runs.py, test_fsdp.py: LoRA runs of grpo train"
    env = words[words.index("--env") + 1] if "--env" in words else ""
    if env.startswith("{") and "math/dataset-v0" in env:
        return "run.yaml's line here, tests/test_own_data_e2e.py: math/dataset-v0 trained"
    if HUB_MODEL in words and env == "math/gsm8k-v0":  # hub model: the tiny one, like run.yaml's
        return "run.yaml's line here: the same path on another environment (built below)"
    return None


def check_as_grpo_train_reads_it(argv: list[str]) -> None:
    """``grpo train ARGV`` up to training: parse, layer the config, build every environment."""
    import grpo_envs
    from grpo_train.config import field_owners
    from grpo_train.train_cli import build_parser, join_negative_values, resolve_config

    args = build_parser().parse_args(join_negative_values(argv))
    config = resolve_config(args)  # a ConfigError names the field and its fix
    flags = [w[2:] for w in argv if w.startswith("--")]
    assert flags, argv
    for name in flags:
        value = getattr(getattr(config, field_owners()[name]), name)
        if name == "env":  # the flag's text, read as YAML by the config
            assert value and all(e.id in args.env for e in value), (value, argv)
        else:  # the flag's text, converted to the field's type
            raw = str(getattr(args, name))
            expected = raw.lower() == "true" if isinstance(value, bool) else type(value)(raw)
            assert value == expected, (name, value, argv)
    for entry in config.data.env:
        assert len(grpo_envs.make(entry.id, **entry.kwargs).dataset("train")) > 0, entry


def test_the_section_still_has_the_commands_this_test_knows():
    lines = [" ".join(c[:2]) for c in commands()]
    assert lines.count("grpo train") >= 4 and lines.count("grpo eval") >= 3
    assert any(c[:3] == ["grpo", "eval", "compare"] for c in commands())
    # Each kind of line checked by parsing is still there, and most lines still run.
    parsed = [c for c in commands() if trained_elsewhere(c)]
    assert len(parsed) == 3 and len(commands()) - len(parsed) >= 10


@pytest.mark.slow
def test_going_further_commands_run_as_written(tiny_model_path, tmp_path, monkeypatch):
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    rows = [{"problem": f"What is {i} + {i}?", "solution": str(2 * i), "qid": f"q{i}"}
            for i in range(40)]  # fmt: skip
    (work / "data" / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (work / "run.yaml").write_text(run_yaml())
    shutil.copytree(ROOT / "benchmarks" / "configs", work / "benchmarks" / "configs")
    bench = ROOT / "tests" / "grpo_envs" / "fixtures" / "benchmarks"
    shutil.copytree(bench / "aime24", work / "data" / "aime24")  # the README's --data_dir
    suites = {  # the benchmark suites' fixtures (a few rows each, in each dataset's schema)
        f"GRPO_{name.upper()}_DIR": str(bench / name)
        for name in ("aime24", "aime25", "amc23", "livecodebench", "humaneval_plus", "mbpp_plus")
    }
    env = {
        **os.environ,
        **suites,
        "GRPO_GPQA_DIR": str(bench / "gpqa_diamond"),
        "GRPO_MATH500_DIR": str(ROOT / "tests" / "grpo_envs" / "fixtures" / "math500"),
        "GRPO_GSM8K_DIR": str(GSM8K),
        "TOKENIZERS_PARALLELISM": "false",
    }
    tiny = str(tiny_model_path)
    train_limits = [
        "--model", tiny, "--engine", "hf", "--max_steps", "1", "--num_generations", "2",
        "--prompts_per_step", "2", "--max_completion_length", "8", "--eval_size", "2",
        "--progress", "false", "--save_every", "1",
    ]  # fmt: skip
    eval_limits = ["--engine", "hf", "--max_tokens", "8", "--limit", "2", "--no_progress"]
    dataset_kwargs = None
    eval_runs: list[str] = []
    checkpoint = None
    for words in commands():
        # Hub models and the README's placeholder checkpoint become the tiny local model.
        argv = [tiny if w in (HUB_MODEL, "./ckpt") or w.startswith("deepseek-ai/") else w
                for w in words[1:]]  # fmt: skip
        if trained_elsewhere(words):  # as written: no limits appended
            monkeypatch.chdir(work)  # its paths are relative to where the user runs
            for name in [n for n in env if n.startswith("GRPO_")]:  # the fixtures' folders
                monkeypatch.setenv(name, env[name])
            check_as_grpo_train_reads_it(argv[1:])
            continue
        if argv[0] == "train":
            argv += train_limits
        elif argv[:2] == ["eval", "compare"]:
            assert len(eval_runs) >= 2, "the compare line needs two evaluations before it"
            # The README's two evaluations differ in protocol (greedy vs n 8), which compare
            # refuses unless told so; the refusal itself is tested with the protocols.
            argv = ["eval", "compare", eval_runs[-2], eval_runs[-1], "--resamples", "200"]
            argv.append("--allow_mismatch")
        elif argv[0] == "eval":
            argv = [checkpoint if "step-000008" in w else w for w in argv]
            if "--model" not in argv:
                argv += ["--model", tiny]
            argv += eval_limits
            if "--protocol" in argv:  # r1 samples 64 per AIME problem: one problem is enough
                argv += ["--limit", "1"]
            if "reasoning" in argv:  # the LiveCodeBench fixture holds release_v2's two files
                argv += ["--env_kwargs", json.dumps({"code/livecodebench-v0": LCB_V2})]
        if argv[0] == "envs" and argv[1] == "show":
            dataset_kwargs = argv[argv.index("--kwargs") + 1]
        argv = [w.replace("{...}", dataset_kwargs or "{...}") for w in argv]
        if argv[0] == "envs" and argv[1] == "score":
            import grpo_envs

            kwargs = json.loads(argv[argv.index("--kwargs") + 1])
            monkeypatch.chdir(work)  # the kwargs' path is relative to where the user runs
            train = grpo_envs.make("math/dataset-v0", **kwargs).dataset("train")
            completions = [{"id": row["id"], "completion": "\\boxed{0}"} for row in train][:3]
            (work / "completions.jsonl").write_text(
                "".join(json.dumps(c) + "\n" for c in completions)
            )
        proc = subprocess.run(
            [GRPO, *argv], cwd=work, env=env, capture_output=True, text=True, timeout=900
        )
        assert proc.returncode == 0, (
            f"{' '.join(words)}\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
        )
        if argv[0] == "eval" and argv[1] != "compare":  # its default folder, as printed
            newest = max((work / "eval_runs").iterdir(), key=lambda p: p.stat().st_mtime)
            eval_runs.append(str(newest))
        if argv[0] == "train" and "--resume" not in argv:
            newest = max((work / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
            checkpoint = str(newest / "checkpoints" / "step-000001" / "model")
            if argv[1:3] == ["--config", "run.yaml"]:
                # "runs/x" in the README stands for this run's folder, as the CLI printed it.
                (work / "runs" / "x").symlink_to(newest.resolve())
    assert len(eval_runs) >= 3
