"""One prompt format for training and evaluation: chat templates, kwargs, system prompts, base
models."""

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from grpo_envs.types import Message, Sample
from grpo_train.config import TrainConfig
from grpo_train.episodes.prompts import PromptFormat, PromptFormatError, encode_prompt

SAMPLE = Sample("s1", (Message("user", "What is 2 + 3?"),), "5")


def base_model_copy(tiny_model_path: Path, out: Path) -> Path:
    """The tiny model as a base model: the same weights, a tokenizer without a chat template."""
    import shutil

    shutil.copytree(tiny_model_path, out)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def base_model(tiny_model_path, tmp_path_factory):
    return base_model_copy(tiny_model_path, tmp_path_factory.mktemp("base") / "model")


def _both(tokenizer, fmt):
    """The prompt training and evaluation both see (one function encodes for both)."""
    encoded = encode_prompt(tokenizer, SAMPLE, fmt, 512)
    assert not encoded.cut
    return encoded.text, encoded.ids


def test_a_base_model_gets_the_plain_format_in_training_and_eval(base_model):
    tok = AutoTokenizer.from_pretrained(base_model)
    assert not tok.chat_template
    text, ids = _both(tok, PromptFormat(prompt_template="Question: {prompt}\nAnswer:"))
    assert text == "Question: What is 2 + 3?\nAnswer:"
    assert tok.decode(ids, skip_special_tokens=True).endswith("Answer:")
    # Training used to crash here ("Cannot use chat template functions...").
    ids_default = encode_prompt(tok, SAMPLE, max_tokens=512).ids
    assert tok.decode(ids_default, skip_special_tokens=True).strip() == "What is 2 + 3?"


def test_system_prompt_and_template_kwargs_reach_the_template(tiny_model_path, tmp_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    template = tmp_path / "t.jinja"
    template.write_text(
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %}/no_think\n{% endif %}"
        "<assistant>"
    )
    fmt = PromptFormat(
        chat_template=str(template),
        chat_template_kwargs={"enable_thinking": False},
        system_prompt="Be brief.",
    )
    text, _ = _both(tok, fmt)
    assert text == "<system>Be brief.\n<user>What is 2 + 3?\n/no_think\n<assistant>"
    text, _ = _both(tok, PromptFormat(chat_template=str(template)))
    assert "/no_think" not in text and "<system>" not in text


def test_the_tokenizers_own_template_is_the_default_and_plain_overrides_it(tiny_model_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    text, _ = _both(tok, PromptFormat())
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    text, _ = _both(tok, PromptFormat(chat_template="plain"))
    assert text == "What is 2 + 3?"


def test_bad_formats_fail_with_the_field_named(tmp_path):
    with pytest.raises(PromptFormatError, match="chat_template"):
        PromptFormat(chat_template=str(tmp_path / "missing.jinja")).template_text()
    with pytest.raises(PromptFormatError, match="prompt_template"):
        PromptFormat(prompt_template="no placeholder")
    with pytest.raises(ValueError, match="prompt_template"):
        TrainConfig.from_flat({"prompt_template": "Q:"})


def test_config_reads_template_kwargs_from_yaml_and_the_command_line(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("chat_template_kwargs: {enable_thinking: false}\nsystem_prompt: Hi\n")
    cfg = TrainConfig.from_yaml(path)
    assert dict(cfg.data.chat_template_kwargs) == {"enable_thinking": False}
    again = TrainConfig.from_yaml(_saved(cfg, tmp_path))
    assert again == cfg
    flat = TrainConfig.from_flat({"chat_template_kwargs": '{"enable_thinking": true}'})
    assert dict(flat.data.chat_template_kwargs) == {"enable_thinking": True}


def _saved(cfg, tmp_path):
    out = tmp_path / "saved.yaml"
    cfg.save(out)
    return out
