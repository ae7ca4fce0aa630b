"""Multi-turn environments in other trainers: TRL's ``rollout_func``, and verl's agent loop.

TRL (checked against trl 1.16 ``GRPOTrainer``). TRL offers two hooks for more than one turn:

- ``environment_factory``: an object whose public methods TRL exposes to the model as TOOLS
  through the chat template's tool calling (``reset`` starts a rollout, ``get_reward`` scores
  it). The environment never answers back on its own: it fits a tool, not an environment that
  replies to a wrong answer, and it needs transformers >= 5.2 and a model trained for tool calls.
- ``rollout_func(prompts, trainer) -> dict``: TRL hands over the generation of a batch (each
  prompt already repeated ``num_generations`` times, one rollout per entry) and takes back
  ``prompt_ids``, ``completion_ids`` and ``logprobs`` per rollout; ``env_mask`` (1 = the model's
  token, 0 = an inserted one) becomes the loss mask (TRL's ``tool_mask``), and every other key is
  passed to the reward functions as a column. It runs with or without vLLM.

``trl_episodes(env)`` uses ``rollout_func``: every episode of the batch is played with
``grpo_train.episodes.driver.generate_episodes`` (all live episodes advance together, one
generate call per turn, on the trainer's own model through ``HFEngine``, which shares its
weights, so no sync is needed), so TRL trains on exactly the ids that were sampled, with the
environment's replies masked, and ``reward_funcs`` returns each episode's score::

    from trl import GRPOConfig, GRPOTrainer
    from grpo_train.episodes.adapters import trl_episodes

    env = grpo_envs.make("math/add2-feedback-v0")
    episodes = trl_episodes(env, max_turn_tokens=64)
    trainer = GRPOTrainer(model, reward_funcs=episodes.reward_funcs,
                          rollout_func=episodes.rollout_func,
                          train_dataset=env.dataset("train"),
                          args=GRPOConfig(max_completion_length=256, ...))

TRL gives ``rollout_func`` the prompts only, so each prompt is matched to its dataset row
(``PromptIndex``): the train dataset must be ``env.dataset(split)`` (rows with the same prompt
and different answers are refused when the index is built). ``max_completion_length`` bounds
the whole episode (every turn and the environment's replies); ``max_turn_tokens`` one turn.
Each reply is rendered after an anchor turn (``grpo_train.episodes.reply_render.ReplyRenderer``), so
templates that rewrite earlier turns (Qwen3's) extend episodes too; a reply the template cannot
render ends the episode there (``BreakPolicy.END``, with a warning): TRL holds one sequence per
rollout.

verl (checked against verl's ``verl/experimental/agent_loop``; verl is not a dependency here).
Its multi-turn hook is the agent loop: a subclass of
``verl.experimental.agent_loop.agent_loop.AgentLoopBase`` registered with
``@register("name")`` (or listed in ``actor_rollout_ref.rollout.agent.agent_loop_config_path``),
selected per row by the dataset's ``agent_name`` column (default
``rollout.agent.default_agent_loop``), with ``data.return_raw_chat=True`` and
``actor_rollout_ref.rollout.mode=async``. Its ``async run(self, sampling_params, **kwargs)``
gets the row's fields (``raw_prompt``, ``extra_info``...) and returns an ``AgentLoopOutput``.
The mapping from an episode (verl's name -> grpo-kit's):

- the row's ``extra_info`` -> the environment: ``grpo_envs.adapters.to_verl_rows`` writes its id
  and ``make`` kwargs, ``grpo_envs.adapters.env_from_reference`` rebuilds it in the worker;
- the prompt ids -> ``EpisodeRenderer(self.tokenizer).prompt_ids(sample)`` (not the
  tokenizer's own ``apply_chat_template(..., tokenize=True)``, which would turn control strings
  in the data into control tokens: environment text is plain text,
  ``grpo_train.episodes.plain_text``);
- one turn, ``await self.server_manager.generate(request_id, prompt_ids=history,
  sampling_params=sampling_params)`` -> ``TokenOutput.token_ids`` / ``.log_probs`` ->
  ``SampledTurn(ids, logprobs)``; its decoded text goes to ``episodic(env).step(state, text,
  tokens=len(ids))``;
- the ids an environment's reply adds (mask 0) -> ``reply_render.ReplyRenderer.inserted``
  (the reply rendered after an anchor turn, verl's own "continuous token" approach; a
  ``TemplateError`` ends the episode: verl holds one sequence per row);
- ``AgentLoopOutput.prompt_ids``, ``response_ids``, ``response_mask``, ``response_logprobs`` ->
  ``verl_agent_output`` of ``assemble_episode(...).sequences[0]``;
- ``AgentLoopOutput.reward_score`` -> ``score_episode(state).reward`` (set, verl's reward
  function is skipped for the row); ``num_turns`` -> user, assistant and environment messages.

so a verl agent loop over any grpo-kit environment is: rebuild the env from ``extra_info``,
``state = episodic(env).start(sample)``, then per turn ``generate``, ``step``,
``ReplyRenderer.inserted`` until ``state.done`` or the response budget
(``rollout.response_length``) is reached, and return
``AgentLoopOutput(**verl_agent_output(sequence, reward, messages), metrics=AgentLoopMetrics())``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpo_envs.types import Sample

if TYPE_CHECKING:
    from grpo_envs.adapters import TRLRewardFunc
    from grpo_envs.base import Environment
    from grpo_train.episodes.tokens import TrainingSequence


def prompt_key(prompt: object) -> str:
    """Return a canonical key for a prompt: a string, or chat messages (their roles and text).

    >>> prompt_key([{"role": "user", "content": "hi"}]) == prompt_key(
    ...     [{"content": "hi", "role": "user", "name": None}])
    True
    """
    if isinstance(prompt, str):
        return json.dumps(prompt)
    if isinstance(prompt, Sequence):
        messages = []
        for m in prompt:
            if not isinstance(m, Mapping):
                raise TypeError(f"a chat prompt is a list of message dicts, got {type(m).__name__}")
            messages.append([str(m.get("role", "")), m.get("content", "")])
        return json.dumps(messages, sort_keys=True, default=str)
    raise TypeError(f"a prompt is a string or a list of messages, got {type(prompt).__name__}")


class PromptIndex:
    """The samples of an environment's split, found by their prompt (what ``rollout_func`` sees).

    Built on first use; a prompt shared by rows with different answers is refused (the rollout
    could not tell which answer an episode is checked against).
    """

    def __init__(self, env: Environment, split: str) -> None:
        """Index ``env.dataset(split)`` lazily."""
        self.env, self.split = env, split
        self._by_prompt: dict[str, Sample] | None = None

    def _build(self) -> dict[str, Sample]:
        by_prompt: dict[str, Sample] = {}
        for row in self.env.dataset(self.split):
            sample = Sample.from_row(row)
            key = prompt_key(row["prompt"])
            seen = by_prompt.setdefault(key, sample)
            if seen.answer != sample.answer:
                raise ValueError(
                    f"rows {seen.id!r} and {sample.id!r} of split {self.split!r} share a prompt "
                    "but not an answer; TRL's rollout_func sees prompts only, so they cannot be "
                    "told apart: make the prompts distinct"
                )
        return by_prompt

    def sample(self, prompt: object) -> Sample:
        """Return the sample whose prompt is ``prompt`` (KeyError naming the fix if none)."""
        if self._by_prompt is None:
            self._by_prompt = self._build()
        try:
            return self._by_prompt[prompt_key(prompt)]
        except KeyError:
            raise KeyError(
                f"a prompt TRL passed is not in split {self.split!r} of {self.env.env_id}; "
                f"pass train_dataset=env.dataset({self.split!r}) (first 80 characters: "
                f"{prompt_key(prompt)[:80]})"
            ) from None


def verl_agent_output(
    sequence: TrainingSequence, reward: float, num_turns: int
) -> dict[str, list[int] | list[float] | float | int]:
    """Return an episode's training sequence as verl's ``AgentLoopOutput`` fields.

    >>> from grpo_train.episodes.tokens import TrainingSequence
    >>> seq = TrainingSequence((1, 2, 5, 9, 7), (0, 0, 1, 0, 1), (0.0, 0.0, -0.5, 0.0, -1.0), 2)
    >>> verl_agent_output(seq, 1.0, 4)["response_mask"]
    [1, 0, 1]
    """
    cut = sequence.prompt_len
    return {
        "prompt_ids": list(sequence.input_ids[:cut]),
        "response_ids": list(sequence.input_ids[cut:]),
        "response_mask": list(sequence.loss_mask[cut:]),
        "response_logprobs": list(sequence.logprobs[cut:]),
        "reward_score": float(reward),
        "num_turns": int(num_turns),
    }


def _tokenizer_of(trainer: Any) -> Any:
    processing = trainer.processing_class
    return getattr(processing, "tokenizer", processing)  # a multimodal processor holds one


def _model_of(trainer: Any) -> Any:
    accelerator = getattr(trainer, "accelerator", None)
    return accelerator.unwrap_model(trainer.model) if accelerator is not None else trainer.model


@dataclass
class TRLEpisodes:
    """What ``GRPOTrainer`` takes: ``rollout_func=`` and ``reward_funcs=`` (see the module doc).

    ``last`` holds the latest batch's episodes (``EpisodeRollout``s, in TRL's order) for logs
    and tests.
    """

    env: Environment
    split: str = "train"
    max_turn_tokens: int | None = None
    last: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        from grpo_envs.episode import episodic

        if self.max_turn_tokens is not None and self.max_turn_tokens < 1:
            raise ValueError(f"max_turn_tokens must be >= 1 or None, got {self.max_turn_tokens}")
        self.episodes = episodic(self.env)
        self.index = PromptIndex(self.env, self.split)
        self._engines: dict[int, Any] = {}

    def rollout_func(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """Play one episode per prompt on the trainer's model; return TRL's rollout dict."""
        from grpo_train.episodes.driver import (
            EpisodeRenderer,
            EpisodeSettings,
            generate_episodes,
            score_episodes,
        )
        from grpo_train.episodes.tokens import BreakPolicy
        from grpo_train.rollout.base import SamplingConfig

        samples = [self.index.sample(p) for p in prompts]
        tokenizer = _tokenizer_of(trainer)
        renderer = EpisodeRenderer(tokenizer)
        prompt_ids = [renderer.prompt_ids(s) for s in samples]
        episode_tokens = int(trainer.max_completion_length)
        top_k = getattr(trainer, "top_k", None)
        sampling = SamplingConfig(
            n=1,
            max_new_tokens=min(self.max_turn_tokens or episode_tokens, episode_tokens),
            temperature=float(trainer.temperature),
            top_p=float(getattr(trainer, "top_p", 1.0) or 1.0),
            top_k=int(top_k) if top_k else -1,
        )
        settings = EpisodeSettings(max_episode_tokens=episode_tokens, on_break=BreakPolicy.END)
        envs = [self.episodes] * len(samples)
        groups = generate_episodes(
            self._engine(_model_of(trainer), tokenizer),
            renderer,
            envs,
            samples,
            prompt_ids,
            sampling,
            settings,
        )
        scores = [s[0] for s in score_episodes(envs, groups)]
        rollouts = [g[0] for g in groups]
        self.last = rollouts
        return {
            "prompt_ids": [list(r.prompt_ids) for r in rollouts],
            "completion_ids": [list(r.completion_ids) for r in rollouts],
            "logprobs": [list(r.sampling_logprobs) for r in rollouts],
            "env_mask": [list(r.loss_mask) for r in rollouts],
            "episode_reward": [s.reward for s in scores],
            "episode_success": [float(s.outcome.is_success) for s in scores],
            "episode_turns": [r.turns for r in rollouts],
            "episode_end": [str(r.state.end) for r in rollouts],
        }

    def _engine(self, model: Any, tokenizer: Any) -> Any:
        from grpo_train.rollout.hf import HFEngine

        key = id(model)
        if key not in self._engines:
            # Shares the module: the trainer's updates are what the next batch samples from.
            self._engines = {key: HFEngine(model, tokenizer)}
        return self._engines[key]

    @property
    def reward_funcs(self) -> list[TRLRewardFunc]:
        """One TRL reward function: each episode's score (from ``rollout_func``'s columns)."""
        return [_episode_reward]


def _episode_reward(completions: Sequence[object], **kwargs: object) -> list[float]:
    rewards = kwargs.get("episode_reward")
    if not isinstance(rewards, list) or len(rewards) != len(completions):
        raise ValueError(
            "episode_reward is missing from the batch: pass rollout_func=episodes.rollout_func "
            "together with reward_funcs=episodes.reward_funcs"
        )
    log_metric = kwargs.get("log_metric")
    turns, success = kwargs.get("episode_turns"), kwargs.get("episode_success")
    if callable(log_metric) and isinstance(turns, list) and isinstance(success, list) and turns:
        log_metric("episodes/turns_mean", sum(turns) / len(turns))
        log_metric("episodes/success", sum(success) / len(success))
    return [float(r) for r in rewards]


_episode_reward.__name__ = "episode_reward"


def trl_episodes(
    env: Environment, *, split: str = "train", max_turn_tokens: int | None = None
) -> TRLEpisodes:
    """Return ``rollout_func`` and ``reward_funcs`` that train ``env``'s episodes in TRL."""
    return TRLEpisodes(env, split, max_turn_tokens)


#: The rollout function's type, as TRL declares ``RolloutFunc``.
RolloutFunc = Callable[[list[Any], Any], dict[str, list[Any]]]

__all__ = [
    "PromptIndex",
    "RolloutFunc",
    "TRLEpisodes",
    "prompt_key",
    "trl_episodes",
    "verl_agent_output",
]
