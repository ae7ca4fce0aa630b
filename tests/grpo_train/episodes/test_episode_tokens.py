"""Token-exact episode sequences with a real (tiny, offline) BPE tokenizer and chat template."""

import pytest

from grpo_train.episodes.tokens import (
    BreakPolicy,
    Extension,
    SampledTurn,
    TemplateBreak,
    assemble_episode,
    render_continuation,
)
from grpo_train.models.loading import _train_tiny_tokenizer

# Qwen3's rule, reduced: an assistant turn that is no longer the last message loses its
# <think> block. The history then stops being a prefix of its own extension.
THINK_DROPPING = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' and not loop.last %}"
    "{% set c = m['content'].split('</think>')[-1].lstrip() %}"
    "{% else %}{% set c = m['content'] %}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    return _train_tiny_tokenizer(512)


def render(tok, messages, generation_prompt):
    return tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )


def char_level(tok, text):
    """Ids of ``text`` one character at a time: a valid sampling the tokenizer would never emit."""
    return [i for ch in text for i in tok.encode(ch, add_special_tokens=False)]


def test_the_sequence_is_the_sampled_ids_plus_the_environments_ids_position_by_position(tok):
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    messages = [{"role": "user", "content": "What is 6 * 7?"}]
    prompt_ids = tok.encode(render(tok, messages, True), add_special_tokens=False)
    first_text, second_text = "The answer is 42", "Yes: 6 * 7 = 42"
    first_ids = [*char_level(tok, first_text), eos]
    # The proof case: decoding then re-encoding does not give back what was sampled.
    assert tok.encode(tok.decode(first_ids), add_special_tokens=False) != first_ids
    second_ids = [*tok.encode(second_text, add_special_tokens=False), eos]
    first = SampledTurn(tuple(first_ids), tuple(-0.01 * (i + 1) for i in range(len(first_ids))))
    second = SampledTurn(tuple(second_ids), tuple(-0.5 for _ in second_ids))

    history = [*messages, {"role": "assistant", "content": first_text}]
    reply = [{"role": "user", "content": "Are you sure?"}]
    continuation = render_continuation(tok, history, first_ids, reply)
    assert isinstance(continuation, Extension)
    assert (
        tok.decode(continuation.ids)
        == "\n<|im_start|>user\nAre you sure?<|im_end|>\n<|im_start|>assistant\n"
    )

    (seq,) = assemble_episode(prompt_ids, [first, second], [continuation]).sequences
    expected = [*prompt_ids, *first_ids, *continuation.ids, *second_ids]
    assert list(seq.input_ids) == expected
    n_p, n_1, n_e = len(prompt_ids), len(first_ids), len(continuation.ids)
    assert seq.loss_mask == (0,) * n_p + (1,) * n_1 + (0,) * n_e + (1,) * len(second_ids)
    assert seq.logprobs == (0.0,) * n_p + first.logprobs + (0.0,) * n_e + second.logprobs
    assert seq.prompt_len == n_p and seq.environment_tokens == n_e
    # The text is the template's rendering of the whole conversation ...
    full = render(tok, [*history, *reply, {"role": "assistant", "content": second_text}], False)
    assert tok.decode(seq.input_ids) == full.removesuffix("\n")
    # ... but re-tokenizing that text would have trained on ids that were never sampled.
    assert tok.encode(full.removesuffix("\n"), add_special_tokens=False) != list(seq.input_ids)


def test_a_turn_cut_before_its_eos_gets_the_whole_closing_from_the_template(tok):
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    ids = tok.encode("hello", add_special_tokens=False)  # max_tokens hit: no <|im_end|> sampled
    continuation = render_continuation(tok, history, ids, [{"role": "user", "content": "more"}])
    assert isinstance(continuation, Extension)
    assert tok.decode(continuation.ids).startswith("<|im_end|>\n<|im_start|>user\nmore")


def test_a_template_that_rewrites_earlier_turns_is_a_typed_break_never_a_retokenization(tok):
    tok = _train_tiny_tokenizer(512)
    tok.chat_template = THINK_DROPPING
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    messages = [{"role": "user", "content": "What is 6 * 7?"}]
    prompt_ids = tok.encode(render(tok, messages, True), add_special_tokens=False)
    text = "<think> 6 * 7 = 42 </think> 42"
    ids = [*tok.encode(text, add_special_tokens=False), eos]
    history = [*messages, {"role": "assistant", "content": text}]
    reply = [{"role": "user", "content": "Sure?"}]
    broke = render_continuation(tok, history, ids, reply)
    assert isinstance(broke, TemplateBreak) and "re-renders earlier history" in broke.reason
    assert tok.decode(broke.restart_ids) == render(tok, [*history, *reply], True)
    assert "<think>" not in tok.decode(broke.restart_ids)

    turns = [SampledTurn(tuple(ids), (-0.1,) * len(ids)), SampledTurn((eos,), (-0.2,))]
    split = assemble_episode(prompt_ids, turns, [broke], on_break=BreakPolicy.SPLIT)
    assert len(split.sequences) == 2 and split.breaks and split.turns_used == 2
    assert split.sequences[0].input_ids == (*prompt_ids, *ids)
    assert split.sequences[1].input_ids == (*broke.restart_ids, eos)
    assert split.sequences[1].loss_mask == (0,) * len(broke.restart_ids) + (1,)
    ended = assemble_episode(prompt_ids, turns, [broke], on_break=BreakPolicy.END)
    assert len(ended.sequences) == 1 and ended.turns_used == 1
    assert ended.sequences[0].input_ids == (*prompt_ids, *ids)


def test_a_sampled_turn_that_is_not_the_messages_content_is_a_break(tok):
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    ids = tok.encode("goodbye", add_special_tokens=False)
    broke = render_continuation(tok, history, ids, [{"role": "user", "content": "x"}])
    assert (
        isinstance(broke, TemplateBreak)
        and "does not end as the template closes it" in broke.reason
    )


def test_misaligned_inputs_are_refused():
    with pytest.raises(ValueError, match="logprobs"):
        SampledTurn((1, 2), (0.0,))
    with pytest.raises(ValueError, match="continuations"):
        assemble_episode([1], [SampledTurn((2,), (0.0,))], [Extension((3,))])
    with pytest.raises(ValueError, match="at least one turn"):
        assemble_episode([1], [], [])


def test_an_empty_turn_still_gets_the_template_closing(tok):
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]
    continuation = render_continuation(tok, history, [], [{"role": "user", "content": "again"}])
    assert isinstance(continuation, Extension)
    assert tok.decode(continuation.ids).startswith("<|im_end|>\n<|im_start|>user\nagain")


# A tool-calling template in the Hermes/Qwen2.5 style (written for this test): the tool schemas go
# into the system message, consecutive tool results share one user turn in <tool_response> tags.
TOOL_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\nTools: ' }}"
    "{% for t in tools %}{{ t['function']['name'] }}{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\\n<tool_response>\\n' + m['content'] + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
    "{{ '<|im_end|>\\n' }}{% endif %}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_tool_results_render_once_as_an_extension_through_a_tool_calling_template():
    from grpo_envs.episode import Step, ToolRecord, ToolStatus
    from grpo_envs.tools import PYTHON_TOOL_SCHEMA, ToolFormat, tool_result_message

    tok = _train_tiny_tokenizer(512)
    tok.chat_template = TOOL_TEMPLATE
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    call = '<tool_call>{"name": "python", "arguments": {"code": "6 * 7"}}</tool_call>'
    history = [
        {"role": "user", "content": "What is 6 * 7?"},
        {"role": "assistant", "content": call + call},
    ]
    records = [ToolRecord("python", "6 * 7", ToolStatus.OK, output="42\n")] * 2
    reply = Step.reply([tool_result_message(r, ToolFormat.HERMES) for r in records]).observation
    assert reply is not None
    messages = [{"role": m.role, "content": m.content} for m in reply.messages]
    ids = [*tok.encode(call + call, add_special_tokens=False), eos]
    continuation = render_continuation(tok, history, ids, messages, tools=[PYTHON_TOOL_SCHEMA])
    assert isinstance(continuation, Extension)
    inserted = tok.decode(continuation.ids)
    assert inserted.count("<tool_response>") == 2 and inserted.count("<|im_start|>user") == 1
    assert inserted.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
