import subprocess
import sys
from pathlib import Path

import pytest

import grpo_envs
from grpo_train.algorithm.advantages import ScaleRewards
from grpo_train.algorithm.choices import LossType
from grpo_train.config import (
    DEFAULT_PRESET,
    SECTIONS,
    ConfigError,
    EnvEntry,
    Resume,
    TrainConfig,
    field_docs,
    field_owners,
    field_resume,
    preset_config,
)


def test_every_field_has_a_docstring_and_a_unique_name():
    owners = field_owners()
    docs = field_docs()
    assert set(owners) == set(docs), f"fields without a docstring: {set(owners) - set(docs)}"
    assert all(len(doc) > 10 for doc in docs.values())
    assert set(owners.values()) == set(SECTIONS)


def test_preset_is_applied_over_the_defaults():
    cfg = preset_config()
    assert cfg.rollout.max_completion_length == DEFAULT_PRESET["max_completion_length"]
    assert cfg.data.env[0].id == "math/arithmetic-v0"
    assert cfg.policy.model == "default"


def test_cli_strings_are_coerced_to_field_types():
    cfg = TrainConfig.from_flat(
        {
            "learning_rate": "1e-5",
            "num_generations": "4",
            "mask_truncated": "true",
            "loss_type": "dr_grpo",
            "scale_rewards": "none",
            "env": "a/x-v0:2,b/y-v1",
        }
    )
    assert cfg.optim.learning_rate == 1e-5
    assert cfg.rollout.num_generations == 4
    assert cfg.algorithm.mask_truncated is True
    assert cfg.algorithm.loss_type is LossType.DR_GRPO
    assert cfg.algorithm.scale_rewards is ScaleRewards.NONE
    assert cfg.data.env == (EnvEntry("a/x-v0", 2.0), EnvEntry("b/y-v1", 1.0))


@pytest.mark.parametrize(
    ("values", "field", "fix"),
    [
        ({"num_generations": 1}, "num_generations", "at least 2"),
        ({"learning_rate": -1}, "learning_rate", "1e-6 is typical"),
        ({"temperature": 0}, "temperature", "try 1.0"),
        ({"loss_type": "ppo"}, "loss_type", "'dapo'"),
        ({"engine": "tgi"}, "engine", "'vllm'"),
        ({"mask_truncated": "maybe"}, "mask_truncated", "true or false"),
        ({"max_steps": "ten"}, "max_steps", "expected int"),
        ({"env": "a/x-v0:heavy"}, "env", "id:weight"),
        ({"keep_last": 0}, "keep_last", "at least 1"),
        ({"attn_implementation": "flash"}, "attn_implementation", "flash_attention_2"),
        ({"attn_implementation": "flash-attn2"}, "attn_implementation", "org/repo"),
        ({"attn_implementation": "a/b/c"}, "attn_implementation", "sdpa"),
        ({"attn_implementation": ""}, "attn_implementation", "eager"),
    ],
)
def test_invalid_values_name_the_field_and_the_fix(values, field, fix):
    with pytest.raises(ConfigError) as err:
        TrainConfig.from_flat(values)
    assert field in str(err.value) and fix in str(err.value)


def test_several_problems_are_reported_together():
    with pytest.raises(ConfigError) as err:
        TrainConfig.from_flat({"num_generations": 1, "beta": -0.1})
    assert "num_generations" in str(err.value) and "beta" in str(err.value)


def test_unknown_field_is_rejected():
    with pytest.raises(ConfigError, match="learning_rat"):
        TrainConfig.from_flat({"learning_rat": 1e-6})


def test_yaml_round_trip_flat_and_sectioned(tmp_path):
    cfg = TrainConfig.from_flat(
        {"learning_rate": 3e-6, "env": [{"id": "m/a-v0", "weight": 2, "kwargs": {"k": 1}}]}
    )
    path = tmp_path / "config.yaml"
    cfg.save(path)
    assert TrainConfig.from_yaml(path) == cfg
    flat = tmp_path / "flat.yaml"
    flat.write_text("learning_rate: 3.0e-6\nenv: [{id: m/a-v0, weight: 2, kwargs: {k: 1}}]\n")
    assert TrainConfig.from_yaml(flat) == cfg


def test_yaml_then_cli_override_layering(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("optim:\n  learning_rate: 5.0e-6\n  warmup_steps: 3\n")
    cfg = TrainConfig.from_flat({"learning_rate": "1e-6"}, TrainConfig.from_yaml(path))
    assert cfg.optim.learning_rate == 1e-6
    assert cfg.optim.warmup_steps == 3


def test_bad_yaml_is_a_config_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        TrainConfig.from_yaml(path)
    with pytest.raises(ConfigError, match="cannot read"):
        TrainConfig.from_yaml(tmp_path / "missing.yaml")


def test_lora_fields_validate_and_parse_module_lists(tmp_path):
    from grpo_train.setup.settings import lora_settings

    assert lora_settings(TrainConfig()) is None  # lora_r = 0: full fine-tuning
    path = tmp_path / "lora.yaml"
    path.write_text("lora_r: 8\nlora_alpha: 16\ntarget_modules: [q_proj, v_proj]\n")
    cfg = TrainConfig.from_yaml(path)
    assert cfg.policy.target_modules == "q_proj,v_proj"
    settings = lora_settings(cfg)
    assert settings is not None and settings.target_modules == ("q_proj", "v_proj")
    assert settings.scale == 2.0
    assert lora_settings(TrainConfig.from_flat({"lora_r": 4})).target_modules == "all-linear"
    with pytest.raises(ConfigError, match="save_merged: need LoRA"):
        TrainConfig.from_flat({"save_merged": True})
    with pytest.raises(ConfigError, match="lora_r"):
        TrainConfig.from_flat({"lora_r": -1})


def test_env_option_accepts_module_prefixed_ids_with_and_without_weights():
    from grpo_train.config import parse_envs as parse

    assert [(e.id, e.weight) for e in parse("pkg.envs:demo/double-v0")] == [
        ("pkg.envs:demo/double-v0", 1.0)
    ]
    assert [(e.id, e.weight) for e in parse("pkg.envs:demo/double-v0:3,math/gsm8k-v0:0.5")] == [
        ("pkg.envs:demo/double-v0", 3.0),
        ("math/gsm8k-v0", 0.5),
    ]
    with pytest.raises(ValueError, match="not a number"):
        parse("math/gsm8k-v0:heavy")


BENCHMARK_CONFIGS = sorted((Path(__file__).parents[2] / "benchmarks" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", BENCHMARK_CONFIGS, ids=lambda p: p.name)
def test_shipped_run_configs_load_and_build_their_environments(path):
    # The README's recorded runs must stay runnable as the fields and environments evolve.
    cfg = TrainConfig.from_yaml(path)
    assert cfg.data.env and cfg.run.output_dir.startswith("runs/")
    for entry in cfg.data.env:
        env = grpo_envs.make(entry.id, **entry.kwargs)
        assert env.dataset("test")[0]["answer"]


def test_benchmark_configs_exist():
    assert len(BENCHMARK_CONFIGS) >= 2


def test_env_flag_takes_flow_yaml_with_kwargs():
    from grpo_train.config import parse_envs

    (entry,) = parse_envs("{id: math/dataset-v0, kwargs: {path: q.jsonl, question: problem}}")
    assert (entry.id, dict(entry.kwargs)) == (
        "math/dataset-v0",
        {"path": "q.jsonl", "question": "problem"},
    )
    assert [
        e.weight for e in parse_envs("[{id: math/add2-v0, weight: 2}, math/arithmetic-v0]")
    ] == [
        2.0,
        1.0,
    ]
    with pytest.raises(ValueError, match="not valid flow YAML"):
        parse_envs("{id: [unclosed")


def test_reading_a_config_imports_no_torch():
    code = (
        "import sys, grpo_train.config, grpo_train.train_cli; "
        "grpo_train.config.TrainConfig.from_flat({'loss_type': 'grpo'}); "
        "grpo_train.train_cli.build_parser(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_field_carries_its_resume_class_in_its_annotation():
    classes = field_resume()
    assert set(classes) == set(field_owners())
    assert classes["mu"] is Resume.FIXED and classes["seed"] is Resume.FIXED
    assert classes["learning_rate"] is Resume.FREE and classes["engine"] is Resume.FREE
    assert classes["lora_r"] is Resume.IDENTITY and classes["model"] is Resume.IDENTITY


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("progress", "Yes", True),  # a bool field
        ("dynamic_sampling", "0", "off"),  # an on/off choice
        ("scale_rewards", "TRUE", ScaleRewards.GROUP),  # TRL's boolean scale_rewards
        ("use_vllm", "no", "hf"),  # a TRL name with a translated value
        ("bf16", True, "bfloat16"),
    ],
)
def test_one_boolean_parser_reads_every_boolean_spelling(name, value, expected):
    field = {"use_vllm": "engine", "bf16": "dtype"}.get(name, name)
    cfg = TrainConfig.from_flat({name: value})
    section = field_owners()[field]
    assert getattr(getattr(cfg, section), field) == expected


@pytest.mark.parametrize("name", ["progress", "dynamic_sampling", "scale_rewards", "use_vllm"])
def test_a_word_that_is_no_boolean_is_refused_by_name(name):
    with pytest.raises(ConfigError, match=rf"{name}: (expected true or false|'maybe' is not)"):
        TrainConfig.from_flat({name: "maybe"})


def test_vllm_tensor_parallel_size_checks() -> None:
    assert TrainConfig().rollout.tensor_parallel == 1
    cfg = TrainConfig.from_flat({"engine": "vllm", "vllm_tensor_parallel_size": 2})
    assert cfg.rollout.tensor_parallel == 2
    with pytest.raises(ConfigError, match="vllm_tensor_parallel_size: 0; must be >= 1"):
        TrainConfig.from_flat({"vllm_tensor_parallel_size": 0})
    with pytest.raises(ConfigError, match=r"with engine hf; .* use --engine vllm"):
        TrainConfig.from_flat({"engine": "hf", "vllm_tensor_parallel_size": 2})
    server = {"vllm_mode": "server", "vllm_server_urls": "http://gen:8000"}
    with pytest.raises(ConfigError, match="grpo serve --tensor_parallel_size 2"):
        TrainConfig.from_flat({**server, "vllm_tensor_parallel_size": 2})
    assert TrainConfig.from_flat(server).rollout.tensor_parallel == 1


@pytest.mark.parametrize(
    "name",
    ["auto", "eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3",
     "kernels-community/flash-attn2", "kernels-community/vllm-flash-attn3@v1:flash_attn_func"],
)  # fmt: skip
def test_attn_implementation_takes_what_transformers_takes_and_config_yaml_records_it(
    tmp_path, name
):
    cfg = TrainConfig.from_flat({"attn_implementation": name})
    assert cfg.policy.attn_implementation == name
    cfg.save(tmp_path / "config.yaml")
    assert "attn_implementation" in (tmp_path / "config.yaml").read_text()
    assert TrainConfig.from_yaml(tmp_path / "config.yaml") == cfg
    assert field_resume()["attn_implementation"] is Resume.FREE  # how it runs, not what
