import subprocess
import sys
import textwrap
from importlib import metadata

import pytest

import grpo_envs
from grpo_envs import registration as reg
from grpo_envs.registration import EnvSpec, RegistryError


@pytest.fixture
def clean_registry(monkeypatch):
    """Run a test against a copy of the registry so registrations do not leak."""
    monkeypatch.setattr(reg, "registry", dict(reg.registry))
    monkeypatch.setattr(reg, "_families", dict(reg._families))
    return reg


def test_builtin_ids_are_listed_without_importing_env_modules():
    ids = [s.id for s in grpo_envs.list_envs()]
    for env_id in (
        "math/gsm8k-v0",
        "math/math500-v0",
        "math/arithmetic-v0",
        "math/add2-v0",
        "math/countdown-v0",
        "format/think-answer-v0",
        "rg/reasoning-gym-v0",
        "code/humaneval-v0",
        "code/mbpp-v0",
        "code/stdio-v0",
    ):
        assert env_id in ids
    assert ids == sorted(ids)
    assert [s.id for s in grpo_envs.list_envs("format")] == ["format/think-answer-v0"]
    # Listing reads the registry only: a fresh interpreter has imported no environment module.
    env_modules = ("grpo_envs.envs.", "grpo_envs.code", "grpo_envs.math", "sandbox")
    probe = (
        "import sys, grpo_envs; grpo_envs.list_envs(); "
        f"print(sorted(m for m in sys.modules if m.startswith({env_modules!r})))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_spec_parts_and_defaults():
    s = grpo_envs.spec("math/add2-v0")
    assert (s.namespace, s.name, s.version) == ("math", "add2", 0)
    assert s.defaults == {"task": "add2"}
    assert s.module == "grpo_envs.envs.arithmetic"


def test_make_applies_defaults_then_overrides_and_records_them():
    env = grpo_envs.make("math/add2-v0", train_size=3, test_size=2)
    assert env.env_id == "math/add2-v0"
    assert env.spec.defaults == {"task": "add2", "train_size": 3, "test_size": 2}
    assert len(env.dataset("train")) == 3
    again = grpo_envs.make(env.spec)  # rebuild from the recorded spec
    assert again.dataset("train")["prompt"] == env.dataset("train")["prompt"]


def test_unknown_id_lists_close_matches():
    with pytest.raises(RegistryError) as info:
        grpo_envs.make("math/gsm8-v0")
    assert "math/gsm8k-v0" in str(info.value)


@pytest.mark.parametrize("bad", ["gsm8k", "math/gsm8k", "math/gsm8k-vX", "/x-v0"])
def test_malformed_id(bad):
    with pytest.raises(RegistryError, match="malformed"):
        grpo_envs.spec(bad)


def test_registering_again_replaces_with_a_warning(clean_registry):
    """A notebook cell run twice: the new entry wins, with a warning (as Gymnasium does)."""
    clean_registry.register("test/dup-v0", "grpo_envs.envs.arithmetic:ArithmeticEnv")
    with pytest.warns(RuntimeWarning, match="overriding environment 'test/dup-v0'"):
        clean_registry.register(
            "test/dup-v0", "grpo_envs.envs.countdown:CountdownEnv", description="second"
        )
    assert grpo_envs.spec("test/dup-v0").entry_point == "grpo_envs.envs.countdown:CountdownEnv"
    assert type(grpo_envs.make("test/dup-v0").unwrapped).__name__ == "CountdownEnv"


def test_bad_entry_point_reports_module_and_attr(clean_registry):
    clean_registry.register("test/missing-v0", "grpo_envs.envs.arithmetic:NoSuchEnv")
    with pytest.raises(RegistryError, match="NoSuchEnv"):
        grpo_envs.make("test/missing-v0")


def test_callable_entry_point_and_bad_kwargs(clean_registry):
    from grpo_envs.envs.arithmetic import ArithmeticEnv

    clean_registry.register("test/callable-v0", ArithmeticEnv, task="add2", train_size=2)
    assert len(grpo_envs.make("test/callable-v0").dataset("train")) == 2
    with pytest.raises(TypeError, match="test/callable-v0"):
        grpo_envs.make("test/callable-v0", no_such_option=1)


def test_module_prefix_imports_the_module_first(clean_registry, tmp_path, monkeypatch):
    (tmp_path / "my_envs_plugin.py").write_text(
        textwrap.dedent("""
        import grpo_envs
        grpo_envs.register("mine/add-v3", "grpo_envs.envs.arithmetic:ArithmeticEnv", task="add2")
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    env = grpo_envs.make("my_envs_plugin:mine/add-v3", train_size=2, test_size=2)
    assert env.env_id == "mine/add-v3"
    sys.modules.pop("my_envs_plugin", None)


def test_family_materialises_ids(clean_registry):
    s = grpo_envs.spec("rg/leg_counting-v0")
    assert s.defaults == {"task": "leg_counting"}
    assert "rg/leg_counting-v0" in clean_registry.registry
    with pytest.raises(RegistryError):  # wrong version of a family is unknown
        grpo_envs.spec("rg/leg_counting-v7")


class _FakeEntryPoint:
    def __init__(self, name, obj):
        self.name, self.value, self._obj = name, f"fake:{name}", obj

    def load(self):
        if isinstance(self._obj, Exception):
            raise self._obj
        return self._obj


def test_plugins_discovered_through_entry_point_group(clean_registry, monkeypatch):
    calls = []

    def plugin():
        calls.append(1)
        clean_registry.register("plug/add-v0", "grpo_envs.envs.arithmetic:ArithmeticEnv")

    eps = [_FakeEntryPoint("good", plugin), _FakeEntryPoint("broken", ImportError("no module"))]
    monkeypatch.setattr(metadata, "entry_points", lambda group: eps if group == "grpo_envs" else [])
    monkeypatch.setattr(reg, "_plugins_loaded", False)
    with pytest.warns(RuntimeWarning, match="broken"):
        ids = [s.id for s in grpo_envs.list_envs()]
    assert "plug/add-v0" in ids and calls == [1]
    grpo_envs.list_envs()  # loaded once only
    assert calls == [1]


def test_envspec_is_frozen():
    s = EnvSpec("a/b-v0", "m:x")
    with pytest.raises(AttributeError):
        s.id = "c/d-v0"  # type: ignore[misc]
