"""The ``sandbox`` config section: flags, YAML, fix-it errors, and the settings built from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_train.config import ConfigError, SandboxConfig, TrainConfig, field_owners
from grpo_train.setup.settings import sandbox_settings
from grpo_train.train_cli import build_parser


def test_the_default_is_the_local_sandbox() -> None:
    assert TrainConfig().sandbox == SandboxConfig()
    assert sandbox_settings(TrainConfig()) is None


def test_every_field_is_a_flag_in_the_sandbox_section() -> None:
    names = [name for name, section in field_owners().items() if section == "sandbox"]
    assert names == [
        "sandbox_backend",
        "sandbox_urls",
        "sandbox_protocol",
        "sandbox_token_env",
        "sandbox_max_in_flight",
        "sandbox_retries",
        "sandbox_request_timeout_s",
    ]
    help_text = build_parser().format_help()
    assert all(f"--{name}" in help_text for name in names)


def test_flags_build_the_remote_settings() -> None:
    cfg = TrainConfig.from_flat(
        {
            "sandbox_backend": "remote",
            "sandbox_urls": "http://a:8080, http://b:8080/",
            "sandbox_protocol": "sandbox_fusion",
            "sandbox_token_env": "SANDBOX_TOKEN",
            "sandbox_max_in_flight": "16",
            "sandbox_retries": "5",
            "sandbox_request_timeout_s": "30",
        }
    )
    settings = sandbox_settings(cfg)
    assert settings is not None
    assert settings.urls == ("http://a:8080", "http://b:8080")
    assert (settings.protocol, settings.token_env) == ("sandbox_fusion", "SANDBOX_TOKEN")
    assert (settings.max_in_flight, settings.retries, settings.request_timeout_s) == (16, 5, 30.0)


def test_a_sectioned_yaml_file_reads_back_and_saves_no_token(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        "sandbox:\n  sandbox_backend: remote\n  sandbox_urls: http://sandbox:8080\n"
        "  sandbox_token_env: SANDBOX_TOKEN\n"
    )
    cfg = TrainConfig.from_yaml(path)
    assert cfg.sandbox.sandbox_urls == "http://sandbox:8080"
    saved = tmp_path / "saved.yaml"
    cfg.save(saved)
    assert TrainConfig.from_yaml(saved) == cfg
    assert "sandbox_token_env: SANDBOX_TOKEN" in saved.read_text()


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"sandbox_backend": "remote"}, "sandbox_backend remote needs sandbox_urls"),
        (
            {"sandbox_backend": "remote", "sandbox_urls": "sandbox:8080"},
            "sandbox_urls: 'sandbox:8080' is not an http:// or https:// URL; write e.g.",
        ),
        ({"sandbox_urls": "http://a:8080"}, "add sandbox_backend remote"),
        ({"sandbox_backend": "cloud"}, "sandbox_backend"),
        ({"sandbox_protocol": "fusion"}, "sandbox_protocol"),
        (
            {"sandbox_backend": "remote", "sandbox_urls": "http://a", "sandbox_max_in_flight": 0},
            "sandbox_max_in_flight must be an int",
        ),
        (
            {"sandbox_backend": "remote", "sandbox_urls": "http://a", "sandbox_token_env": "x y"},
            "NAME of the environment variable",
        ),
        ({"sandbox_request_timeout_s": -1}, "sandbox_request_timeout_s: -1.0; must be >= 0"),
    ],
)
def test_bad_sandbox_settings_fail_naming_the_field_and_the_fix(
    values: dict[str, object], says: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        TrainConfig.from_flat(values)
    assert says in str(caught.value)


def test_the_sandbox_fields_may_change_on_resume() -> None:
    from grpo_train.config import RESUME_FREE

    assert {n for n, s in field_owners().items() if s == "sandbox"} <= RESUME_FREE


def test_grpo_eval_takes_the_same_flags() -> None:
    from grpo_train.eval_cli import parse_eval_args

    base = ["--model", "m", "--suite", "gsm8k"]
    assert parse_eval_args(base).sandbox is None
    args = parse_eval_args(
        [*base, "--sandbox_backend", "remote", "--sandbox_urls", "http://a:1,http://b:2"]
    )
    assert args.sandbox is not None and args.sandbox.urls == ("http://a:1", "http://b:2")
    with pytest.raises(ValueError, match="sandbox_backend remote needs sandbox_urls"):
        parse_eval_args([*base, "--sandbox_backend", "remote"])
