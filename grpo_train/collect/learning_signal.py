"""The learning-signal guard and the automatic choices it drives, with one owner.

``SignalGuard`` notices a run whose groups keep having equal rewards (no gradient).
``AutoHeuristics`` owns what a run does about it (``curriculum=auto``: the task drops to its
easiest version, once; ``dynamic_sampling=auto``: DAPO dynamic sampling turns on for the rest
of the run), the guard's state saved in checkpoints, and the record of every switch (``Switch``:
those, and each curriculum stage change) that the run summary prints.

"Signal" here is the learning signal (reward differences within a group), not an OS signal
(Ctrl-C, SIGTERM: ``grpo_train.run.stop``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from grpo_train.algorithm.choices import Estimator

if TYPE_CHECKING:
    from grpo_train.collect.training_prompts import TrainingPrompts
    from grpo_train.run.checkpoint import SamplerState


@dataclass(frozen=True)
class AutoSettings:
    """What the automatic choices read of the run's configuration (``setup.settings`` builds it).

    The defaults are the configuration's.
    """

    dynamic_sampling: Literal["auto", "on", "off"] = "auto"
    curriculum: Literal["auto", "on", "off"] = "auto"
    advantage_estimator: Estimator = Estimator.GRPO
    """``ema`` learns from equal-reward groups: no stall to answer."""
    temperature: float = 1.0
    """The rollout temperature (the stall advice names it)."""
    num_generations: int = 8
    """The group size (the stall advice names it)."""
    curriculum_threshold: float = 0.6
    """The training accuracy a curriculum stage moves up at (the stall advice names it)."""


@dataclass
class SignalGuard:
    """Notice a run that is not learning because its groups' rewards all agree.

    A group whose completions all get the same reward has zero advantage: no gradient. When at
    least ``threshold`` of the groups are like that for ``patience`` steps in a row, ``update``
    returns True, once (``rearm`` watches again); ``advice`` is the line to print. ``eased``:
    the run already answered a stall with an easier curriculum stage, which it does only once.

    >>> guard = SignalGuard(threshold=0.75, patience=2)
    >>> [guard.update(f) for f in (0.9, 0.5, 0.8, 1.0, 1.0)]
    [False, False, False, True, False]
    """

    # 0.9, not "most": the embedded default run starts with 3 of 4 groups all wrong (its sampled
    # accuracy is 3% at step 1) and learns fast; the guard is for runs where nearly nothing does.
    threshold: float = 0.9
    patience: int = 3
    streak: int = 0
    fired: bool = False
    eased: bool = False

    def update(self, frac_zero_std: float) -> bool:
        """Record one step's share of equal-reward groups; True when the guard fires."""
        self.streak = self.streak + 1 if frac_zero_std >= self.threshold else 0
        if self.fired or self.streak < self.patience:
            return False
        self.fired = True
        return True

    def rearm(self) -> None:
        """Watch again from a fresh streak, after the curriculum eased the task (``eased``)."""
        self.streak, self.fired, self.eased = 0, False, True

    def advice(
        self,
        step: int,
        settings: AutoSettings,
        dynamic_sampling_now_on: bool,
        easier_now: Sequence[str] = (),
    ) -> str:
        """One line: what happened and what to try, with this run's numbers.

        ``easier_now``: the environments that the automatic curriculum just sent to their easiest
        version.
        """
        tries = [
            "dynamic_sampling=true (drop equal-reward groups, draw more prompts)"
            if not dynamic_sampling_now_on
            else "more dynamic_sampling_rounds",
            f"a higher temperature (now {settings.temperature:g})",
            f"larger groups (num_generations, now {settings.num_generations})",
            "a reward with partial credit (e.g. step_credit for arithmetic chains)",
        ]
        if not easier_now:
            tries.append("an easier curriculum (a lower difficulty first; env stages)")
        now = (
            "; dynamic_sampling=auto is now on for the rest of the run"
            if dynamic_sampling_now_on
            else ""
        )
        if easier_now:
            now += (
                f"; curriculum=auto: {', '.join(easier_now)} now trains on its easiest version "
                "first and moves up as its training accuracy reaches curriculum_threshold="
                f"{settings.curriculum_threshold:g} (evaluation stays on the task as "
                "configured)"
            )
        return (
            f"learning signal: at step {step}, >= {self.threshold:.0%} of groups had equal "
            f"rewards (no gradient) for {self.patience} steps in a row{now}. Try: "
            + "; ".join(tries)
        )


@dataclass(frozen=True)
class Switch:
    """One change of what a run samples, decided during the run: after ``step``, ``what``."""

    step: int
    what: str

    def describe(self) -> str:
        """Return 'after step 3: ...'.

        >>> Switch(3, "dynamic_sampling=auto on").describe()
        'after step 3: dynamic_sampling=auto on'
        """
        return f"after step {self.step}: {self.what}"


class AutoHeuristics:
    """The one owner of ``curriculum=auto`` and ``dynamic_sampling=auto`` in a run.

    Its state is the ``SignalGuard`` (restored from and saved into the checkpoint's
    ``SamplerState``, whose ``signal_*`` fields it is); ``dynamic_sampling`` says whether this
    step's collection drops equal-reward groups and draws more; ``watch`` takes each step's
    metrics, answers a stall (an easier curriculum first, then dynamic sampling) and returns the
    line to print; ``switches`` lists what changed after which step over the whole run: a
    resumed launch starts with its checkpoint's record (``earlier``; the checkpoint's
    ``switches.json``), and the checkpoints it writes carry the list on.
    """

    def __init__(
        self,
        settings: AutoSettings,
        prompts: TrainingPrompts,
        saved: SamplerState | None,
        step: int,
        earlier: Sequence[tuple[int, str]] | None = None,
    ) -> None:
        self.settings, self.prompts = settings, prompts
        self.guard = SignalGuard()
        self.switches: list[Switch] = [Switch(s, what) for s, what in earlier or ()]
        if saved is not None:
            # Without the guard's state a resumed run would sample differently from the
            # uninterrupted one.
            self.guard = SignalGuard(
                streak=saved.signal_streak, fired=saved.signal_fired, eased=saved.signal_eased
            )
        if saved is not None and earlier is None:
            # A checkpoint written before switches were recorded: say what was already on.
            if self.guard.eased:
                self.switches.append(Switch(step, "curriculum=auto had eased (resumed)"))
            if self.dynamic_sampling and settings.dynamic_sampling == "auto":
                self.switches.append(Switch(step, "dynamic_sampling=auto was on (resumed)"))
        self._stages = self._stage_metrics(prompts.stage_metrics())

    @property
    def dynamic_sampling(self) -> bool:
        """Whether this step drops equal-reward groups and draws more (DAPO dynamic sampling)."""
        mode = self.settings.dynamic_sampling
        return mode == "on" or (mode == "auto" and self.guard.fired)

    def watch(self, step: int, metrics: Mapping[str, float]) -> str | None:
        """Take a step's metrics; return the line to print when the learning signal stalled."""
        self._note_stage_changes(step, metrics)
        frac = metrics.get("group/frac_zero_std")
        if self.settings.advantage_estimator is Estimator.EMA:
            return None  # equal-reward groups still learn against the EMA baseline: not a stall
        if frac is None or not self.guard.update(frac):
            return None
        easier: list[str] = []
        if self.settings.curriculum == "auto" and not self.guard.eased:
            easier = self.prompts.ease()
        if easier:
            # The curriculum removes the cause (a task the policy is never right on), while
            # redrawing prompts of that task (dynamic sampling) spends generation time for few
            # kept groups. The guard re-arms: if the signal stalls again, it fires again, and
            # then dynamic_sampling=auto turns on.
            self.guard.rearm()
            self._stages = self._stage_metrics(self.prompts.stage_metrics())
            self.switches += [Switch(step, f"curriculum=auto sent {e}") for e in easier]
        # The guard stays fired (dynamic_sampling=auto draws more from now on) unless re-armed.
        auto = self.settings.dynamic_sampling == "auto" and self.guard.fired
        if auto:
            self.switches.append(Switch(step, "dynamic_sampling=auto on for the rest of the run"))
        return self.guard.advice(step, self.settings, auto, easier)

    def record(self) -> list[tuple[int, str]]:
        """Return ``(step, what)`` of every switch so far, as checkpoints store them.

        >>> class NoPrompts:
        ...     def stage_metrics(self): return {}
        >>> auto = AutoHeuristics(AutoSettings(), NoPrompts(), None, 0, [(3, "a"), (5, "b")])
        >>> auto.record(), auto.switches[1].describe()
        ([(3, 'a'), (5, 'b')], 'after step 5: b')
        """
        return [(switch.step, switch.what) for switch in self.switches]

    def saved_into(self, state: SamplerState) -> SamplerState:
        """Return the checkpoint's data state with the guard's state in it."""
        g = self.guard
        return replace(state, signal_streak=g.streak, signal_fired=g.fired, signal_eased=g.eased)

    def _note_stage_changes(self, step: int, metrics: Mapping[str, float]) -> None:
        stages = self._stage_metrics(metrics)
        for name, stage in stages.items():
            if name in self._stages and self._stages[name] != stage:
                where = self.prompts.describe_stage(name)
                self.switches.append(Switch(step, f"curriculum moved {where}"))
        self._stages.update(stages)

    @staticmethod
    def _stage_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
        prefix = "curriculum/stage/"
        return {k[len(prefix) :]: v for k, v in metrics.items() if k.startswith(prefix)}
