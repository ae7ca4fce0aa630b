"""A library deprecation raised through a grpo-kit call fails the test run; one raised by the
test itself, or by another library, only warns (project_warnings.py, pyproject's filterwarnings).

The library here is a module named ``fakelib`` built at run time, so its frames name another
package than the project's and the tests': its model's forward is wrapped by transformers' own
``deprecate_kwarg`` (the decorator behind "past_key_values is deprecated ... Use cache
instead"), and its property warns as transformers' ``is_gradient_checkpointing`` does.
"""

from __future__ import annotations

import types
import warnings

import pytest
import torch

from grpo_train.learner.forward import token_logprobs
from grpo_train.learner.micro_batches import MicroBatch
from grpo_train.models.hf_compat import checkpointing_enabled

_FAKELIB = '''
import warnings
from types import SimpleNamespace

import torch
from transformers.utils.deprecation import deprecate_kwarg


class Model(torch.nn.Module):
    """A causal LM whose forward has deprecated ``use_cache`` (as transformers renames keywords)."""

    def __init__(self, vocab=11):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, vocab)

    @deprecate_kwarg("use_cache", "99.0.0")
    def forward(self, input_ids, attention_mask=None, position_ids=None, logits_to_keep=0,
                use_cache=None):
        logits = self.embed(input_ids)
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)

    @property
    def is_activation_checkpointing(self):
        warnings.warn("is_activation_checkpointing is deprecated", FutureWarning)  # stacklevel 1
        return False


def forward_for_the_caller(model, **kwargs):
    """Another library that makes the deprecated call itself."""
    return model(**kwargs)
'''


@pytest.fixture(scope="module")
def fakelib() -> types.ModuleType:
    module = types.ModuleType("fakelib")
    exec(compile(_FAKELIB, "fakelib.py", "exec"), module.__dict__)
    return module


def _micro_batch() -> MicroBatch:
    ids = torch.tensor([[1, 2, 3, 4], [1, 2, 5, 6]])
    mask = torch.ones_like(ids)
    pos = torch.arange(4).expand(2, 4)
    return MicroBatch((0, 1), ids, mask, pos, ids[:, 2:], mask[:, 2:])


def test_a_deprecated_keyword_in_the_projects_forward_call_fails(fakelib):
    with pytest.raises(FutureWarning, match="use_cache"):
        token_logprobs(fakelib.Model(), _micro_batch())


def test_a_deprecated_property_read_by_the_project_fails(fakelib):
    with pytest.raises(FutureWarning, match="is_activation_checkpointing"):
        checkpointing_enabled(fakelib.Model())


def test_the_same_deprecations_from_other_callers_only_warn(fakelib):
    model, mb = fakelib.Model(), _micro_batch()
    calls = [
        lambda: model(input_ids=mb.input_ids, use_cache=False),  # the test's own call
        lambda: fakelib.forward_for_the_caller(model, input_ids=mb.input_ids, use_cache=False),
        lambda: model.is_activation_checkpointing,
    ]
    for call in calls:
        with warnings.catch_warnings(record=True) as seen:  # the run's filters, recorded
            call()
        assert [w.category for w in seen] == [FutureWarning]
