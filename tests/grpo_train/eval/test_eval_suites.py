import pytest

from grpo_train.eval.suites import BUILTIN_SUITES, Task, load_suites_file, resolve_tasks

REGISTERED = [
    "math/gsm8k-v0",
    "math/math500-v0",
    "code/humaneval-v0",
    "code/mbpp-v0",
    "math/arithmetic-v0",
]


def test_builtin_suites_expand_to_env_ids():
    tasks = resolve_tasks("gsm8k,humaneval", registered_env_ids=REGISTERED)
    assert tasks == [
        Task("gsm8k", "math/gsm8k-v0", "gsm8k"),
        Task("humaneval", "code/humaneval-v0", "humaneval"),
    ]
    import grpo_envs

    registered = {s.id for s in grpo_envs.list_envs()}
    assert {e for s in BUILTIN_SUITES.values() for e in s.env_ids} <= registered


def test_multi_env_suite_labels_and_dedup():
    tasks = resolve_tasks("math,gsm8k,math/arithmetic-v0", registered_env_ids=REGISTERED)
    assert [t.label for t in tasks] == [
        "math:math/gsm8k-v0",
        "math:math/math500-v0",
        "math/arithmetic-v0",
    ]


def test_unknown_suite_lists_close_matches():
    with pytest.raises(ValueError, match="Did you mean gsm8k"):
        resolve_tasks("gsm8", registered_env_ids=REGISTERED)
    with pytest.raises(ValueError, match="empty"):
        resolve_tasks(" , ", registered_env_ids=REGISTERED)


def test_user_suites_from_yaml(tmp_path):
    path = tmp_path / "suites.yaml"
    path.write_text("suites:\n  quick: math/arithmetic-v0\n  mine: [math/gsm8k-v0, code/mbpp-v0]\n")
    user = load_suites_file(path)
    tasks = resolve_tasks("quick,mine", user_suites=user, registered_env_ids=REGISTERED)
    assert [(t.label, t.env_id) for t in tasks] == [
        ("quick", "math/arithmetic-v0"),
        ("mine:math/gsm8k-v0", "math/gsm8k-v0"),
        ("mine:code/mbpp-v0", "code/mbpp-v0"),
    ]
    flat = tmp_path / "flat.yaml"
    flat.write_text("gsm8k: [math/arithmetic-v0]\n")  # a user may override a built-in name
    assert (
        resolve_tasks("gsm8k", user_suites=load_suites_file(flat))[0].env_id == "math/arithmetic-v0"
    )


@pytest.mark.parametrize(
    "text", ["[1, 2]", "suites:\n  bad: []\n", "suites:\n  bad: {a: 1}\n", "a: [b"]
)
def test_bad_suites_files_are_clear_errors(tmp_path, text):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"suites_file|suite 'bad'"):
        load_suites_file(path)


def test_missing_suites_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_suites_file(tmp_path / "nope.yaml")


def test_any_id_make_accepts_is_a_suite_item(tmp_path, monkeypatch):
    """Registered ids, families (rg/<task>-v0) and module:id resolve as grpo train --env does."""
    (tmp_path / "my_suite_envs.py").write_text(
        "from grpo_envs import register\n"
        "register('mine/add-v0', 'grpo_envs.envs.arithmetic:ArithmeticEnv', task='add2')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    items = "math/add2-v0,rg/leg_counting-v0,my_suite_envs:mine/add-v0"
    tasks = resolve_tasks(items)
    assert [t.env_id for t in tasks] == items.split(",")
    with pytest.raises(ValueError, match="unknown suite or env id 'math/nope-v0'"):
        resolve_tasks("math/nope-v0")
    with pytest.raises(ValueError, match="cannot import module 'no_such_module_xyz'"):
        resolve_tasks("no_such_module_xyz:mine/add-v0")


def test_suites_file_entries_carry_make_kwargs(tmp_path):
    path = tmp_path / "suites.yaml"
    path.write_text(
        "suites:\n  mine:\n    - id: math/dataset-v0\n      kwargs: {path: q.jsonl, answer: a}\n"
        "    - math/add2-v0\n"
    )
    tasks = resolve_tasks("mine", user_suites=load_suites_file(path))
    assert [(t.env_id, dict(t.kwargs)) for t in tasks] == [
        ("math/dataset-v0", {"path": "q.jsonl", "answer": "a"}),
        ("math/add2-v0", {}),
    ]
    path.write_text("suites:\n  bad:\n    - {id: math/add2-v0, weight: 2}\n")
    with pytest.raises(ValueError, match=r"\{id, kwargs\} entry"):
        load_suites_file(path)
