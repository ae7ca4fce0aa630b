"""A named model gets a real model's defaults (gradient checkpointing on), said at start-up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from grpo_train.config import CHECKPOINTING_MIN_WIDTH, real_model_defaults
from grpo_train.models.loading import model_shape
from grpo_train.train_cli import build_parser, main, resolve_with_defaults


def _resolve(argv: list[str]):
    return resolve_with_defaults(build_parser().parse_args(argv))


def _model_folder(tmp_path: Path, layers: int, hidden: int, nested: bool = False) -> str:
    folder = tmp_path / f"model-{layers}x{hidden}"
    folder.mkdir()
    shape = {"num_hidden_layers": layers, "hidden_size": hidden}
    config = {"model_type": "x", "text_config": shape} if nested else shape
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize(
    "model", ["Qwen/Qwen3-0.6B", "HuggingFaceTB/SmolLM2-135M-Instruct", "default"]
)
def test_a_named_real_model_gets_gradient_checkpointing(model):
    cfg, chosen = _resolve(["--model", model, "--env", "math/gsm8k-v0"])
    assert cfg.policy.gradient_checkpointing is True
    assert [(c.field, c.value) for c in chosen] == [("gradient_checkpointing", True)]


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("layers, hidden, on", [(30, 576, True), (2, 128, False), (4, 1024, True)])
def test_a_local_model_is_judged_by_its_width(tmp_path, layers, hidden, on, nested):
    model = _model_folder(tmp_path, layers, hidden, nested)
    assert model_shape(model) == (layers, hidden)
    cfg, chosen = _resolve(["--model", model])
    assert cfg.policy.gradient_checkpointing is on
    assert chosen[0].value is on and (layers * hidden >= CHECKPOINTING_MIN_WIDTH) is on


def test_the_tiny_test_model_keeps_it_off_unless_asked(tiny_model_path):
    cfg, chosen = _resolve(["--model", str(tiny_model_path), "--env", "math/add2-v0"])
    assert cfg.policy.gradient_checkpointing is False
    assert "2 layers x hidden 128" in chosen[0].describe()
    cfg, chosen = _resolve(["--model", str(tiny_model_path), "--gradient_checkpointing"])
    assert cfg.policy.gradient_checkpointing is True and chosen == ()


@pytest.mark.parametrize(
    "argv, config, expected",
    [
        (["--gradient_checkpointing", "false"], None, False),
        (["--gradient-checkpointing", "no"], None, False),
        ([], {"gradient_checkpointing": False}, False),  # a flat YAML file
        ([], {"policy": {"gradient_checkpointing": False}}, False),  # a sectioned one
        ([], {"learning_rate": 1e-6}, True),  # a file that says nothing about it
        (["--gradient_checkpointing", "true"], {"gradient_checkpointing": False}, True),
    ],
)
def test_what_the_user_gives_wins_over_the_default(tmp_path, argv, config, expected):
    args = ["--model", "Qwen/Qwen3-0.6B", *argv]
    if config is not None:
        path = tmp_path / "run.yaml"
        path.write_text(yaml.safe_dump(config))
        args += ["--config", str(path)]
    cfg, chosen = _resolve(args)
    assert cfg.policy.gradient_checkpointing is expected
    given = bool(argv) or "gradient_checkpointing" in json.dumps(config)
    assert (chosen == ()) is given


def test_a_saved_config_resumes_with_what_it_recorded(tmp_path):
    cfg, _ = _resolve(["--model", "Qwen/Qwen3-0.6B", "--gradient_checkpointing", "false"])
    cfg.save(tmp_path / "config.yaml")
    again, chosen = _resolve(["--config", str(tmp_path / "config.yaml")])
    assert again.policy.gradient_checkpointing is False and chosen == ()


def test_the_embedded_quick_start_keeps_it_off():
    cfg, chosen = _resolve([])
    assert cfg.policy.gradient_checkpointing is False and chosen == ()


@pytest.mark.parametrize("shape", [(0, 128), (2, 0)])
def test_a_config_without_a_usable_shape_is_taken_as_a_real_model(tmp_path, shape):
    model = _model_folder(tmp_path, *shape)
    assert model_shape(model) is None
    assert real_model_defaults(None)[0].value is True
    (Path(model) / "config.json").write_text("not json")
    assert model_shape(model) is None


def test_the_start_up_line_names_the_defaults_and_why(tmp_path, capsys, tiny_model_path):
    out = tmp_path / "run"
    # A model folder that is missing: the run stops after the start-up lines (exit 2).
    code = main(["--model", str(tmp_path / "missing"), "--engine", "hf", "--output_dir", str(out)])
    assert code == 2
    printed = capsys.readouterr().out
    assert "real-model defaults: gradient_checkpointing=true (a real model:" in printed
    assert "less memory per completion token" in printed
    code = main(
        ["--model", str(tiny_model_path), "--env", "math/nope-v0", "--engine", "hf",
         "--output_dir", str(tmp_path / "tiny")]
    )  # fmt: skip
    assert code == 2
    printed = capsys.readouterr().out
    assert "real-model defaults: gradient_checkpointing=false (2 layers x hidden 128" in printed
    code = main(["--model", str(tmp_path / "missing"), "--gradient_checkpointing", "false",
                 "--output_dir", str(tmp_path / "asked")])  # fmt: skip
    assert code == 2 and "real-model defaults" not in capsys.readouterr().out
