"""Token-budget micro-batches of (prompt, completion) pairs: padded, grouped by prompt or packed.

``make_micro_batches`` cuts a batch into micro-batches (``MicroBatch``) that fit a token budget;
``packing_pays`` (with the model's ``ForwardCost``) decides whether a step's rows cost less packed
end to end than through the shared-prompt forward over padded rows, whose completions share
bins (``completion_bins``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch


@dataclass(frozen=True)
class MicroBatch:
    """Padded (prompt, completion) pairs for one forward pass.

    Prompts are left-padded and completions right-padded, so every completion starts at column
    ``P`` and the last ``C + 1`` logits cover all completion tokens.
    """

    rows: tuple[int, ...]
    """Indices of these pairs in the full batch."""
    input_ids: torch.Tensor  # (B, P + C)
    attention_mask: torch.Tensor  # (B, P + C)
    position_ids: torch.Tensor  # (B, P + C)
    completion_ids: torch.Tensor  # (B, C)
    completion_mask: torch.Tensor  # (B, C): 1 on real completion tokens
    targets: torch.Tensor | None = None
    """Packed (``make_micro_batches(packed=True)``): the rows are one (1, N) sequence, each
    row's ``position_ids`` restarting at 0, and ``targets`` (T,) are the columns whose logits
    predict the T real completion tokens (row by row, the order of ``completion_mask``'s ones).
    The model then runs without an attention mask (see ``forward.token_logprobs``). None: padded."""

    def to(self, device: str) -> MicroBatch:
        """Return this micro-batch with its tensors on ``device`` (they are built on the CPU)."""
        if device == "cpu":
            return self
        return replace(
            self,
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            position_ids=self.position_ids.to(device),
            completion_ids=self.completion_ids.to(device),
            completion_mask=self.completion_mask.to(device),
            targets=self.targets.to(device) if self.targets is not None else None,
        )


def make_micro_batches(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    token_budget: int,
    pad_id: int,
    select: Sequence[int] | None = None,
    group_prompts: bool = False,
    packed: bool = False,
) -> list[MicroBatch]:
    """Split pairs into micro-batches whose padded size (rows x longest row) fits ``token_budget``.

    Pairs are sorted by length first so that similar lengths share a micro-batch (less padding);
    a pair longer than the budget gets a micro-batch of its own. ``select``: only these pairs
    (e.g. ``rows_with_gradient``); ``MicroBatch.rows`` still index the full lists.
    ``group_prompts``: sort by prompt instead (length, then tokens), so that the completions of
    one prompt share micro-batches and ``token_logprobs(share_prompts=True)`` runs the prompt once.
    ``packed``: no padding at all; each micro-batch is its pairs end to end in one sequence
    (``MicroBatch.targets``) of at most ``token_budget`` real tokens (a longer pair alone).
    """
    chosen = range(len(prompts)) if select is None else select
    if packed:
        return _pack_groups(prompts, completions, chosen, token_budget, pad_id)
    groups = _padded_groups(prompts, completions, chosen, token_budget, group_prompts)
    return [
        _pad([prompts[i] for i in g], [completions[i] for i in g], tuple(g), pad_id) for g in groups
    ]


def _padded_groups(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    chosen: Sequence[int] | range,
    token_budget: int,
    group_prompts: bool,
) -> list[list[int]]:
    """Return the rows of each padded micro-batch (``make_micro_batches`` without ``packed``)."""

    def total(i: int) -> int:
        return len(prompts[i]) + len(completions[i])

    if group_prompts:
        order = sorted(chosen, key=lambda i: (len(prompts[i]), tuple(prompts[i]), total(i)))
    else:
        order = sorted(chosen, key=total)
    groups: list[list[int]] = []
    longest = 0
    for i in order:
        if groups and (len(groups[-1]) + 1) * max(longest, total(i)) <= token_budget:
            groups[-1].append(i)
            longest = max(longest, total(i))
        else:
            groups.append([i])
            longest = total(i)
    return groups


#: Attention implementations that take a custom (B, 1, Q, K) mask, which the completion bins
#: need (a bin's completions attend to the cached prompt and each to itself): transformers
#: passes a 4-D mask through unchanged to these two; flash-attention kernels take no mask.
MASKED_ATTENTION = ("sdpa", "eager")


@dataclass(frozen=True)
class ForwardCost:
    """What a forward costs, in token positions: for ``packing_pays``.

    A token position costs its share of every layer's projections and MLP and of the vocabulary
    head; a query-key pair of attention costs ``pair_weight`` of that. ``varlen``: packed rows
    attend only within themselves (flash-attention's varlen kernels); otherwise attention runs
    over the whole pack under a block-diagonal mask (SDPA and eager: quadratic in the pack).
    """

    pair_weight: float = 0.0
    varlen: bool = True
    bins: bool = False
    """The attention takes a custom mask (``MASKED_ATTENTION``), so the shared-prompt forward
    runs its completions in bins (``completion_bins``) rather than one padded row each."""

    @classmethod
    def of(cls, config: Any) -> ForwardCost:
        """Return the cost weights of a transformers decoder config (multiply-adds).

        Per layer, a position runs q/k/v/o (about 4 h^2) and the MLP (3 h i); the head adds h V
        once; a pair costs 2 h (its score and its share of the weighted sum).

        >>> from types import SimpleNamespace as C
        >>> round(1 / ForwardCost.of(C(hidden_size=576, intermediate_size=1536,
        ...     num_hidden_layers=30, vocab_size=49152)).pair_weight)
        4275
        """
        h = int(getattr(config, "hidden_size", 0) or 0)
        layers = int(getattr(config, "num_hidden_layers", 0) or 0)
        if h <= 0 or layers <= 0:
            return cls()
        inner = int(getattr(config, "intermediate_size", 0) or 4 * h)
        vocab = int(getattr(config, "vocab_size", 0) or 0)
        position = layers * (4 * h * h + 3 * h * inner) + h * vocab
        implementation = str(getattr(config, "_attn_implementation", "") or "")
        return cls(
            pair_weight=layers * 2 * h / position,
            varlen="flash" in implementation,
            bins=implementation in MASKED_ATTENTION,
        )


def packing_pays(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    token_budget: int,
    select: Sequence[int] | None = None,
    cost: ForwardCost = ForwardCost(),
) -> bool:
    """Whether packed rows cost less to run than the shared-prompt forward over padded rows.

    The two save different waste. The shared-prompt forward (``token_logprobs(share_prompts=
    True)``) runs each distinct prompt of a micro-batch once but pads every completion to the
    micro-batch's longest; packing runs every row's own prompt again but pads nothing. So the
    shared forward costs, per padded micro-batch, (distinct prompts x longest prompt) + (rows x
    longest completion) positions (rows x longest row where no prompt repeats: then it runs
    the plain forward); packing costs the real tokens of every row, prompt included. Attention
    adds ``cost.pair_weight`` per query-key pair: each prompt over itself and each padded
    completion over prompt and completion; a pack over itself (``cost.varlen``: each row over
    itself).

    Uniform lengths: the shared forward wins (8 completions of 10 tokens under one 30-token
    prompt: 30 + 80 positions against 8 x 40 = 320). A 40x length spread: packing wins (one
    400-token completion pads seven 10-token ones to 400: 30 + 3,200 against 710).

    >>> packing_pays([[1] * 30] * 8, [[2] * 10] * 8, 10_000)
    False
    >>> packing_pays([[1] * 30] * 8, [[2] * 400] + [[2] * 10] * 7, 10_000)
    True
    >>> packing_pays([[1] * 30] * 8, [[2] * 400] + [[2] * 10] * 7, 10_000, select=[1, 2])
    False

    Attention can turn it: 32 rows of 100 tokens and one of 200 save positions packed (4,260
    against 6,430), but a dense mask over the 4,260-token pack costs 18.1 M pairs against the
    padded rows' 1.5 M; with SmolLM2-135M's weights (``ForwardCost.of``: a position is worth
    4,275 pairs) the shared forward wins, with varlen kernels packing does:

    >>> prompts, completions = [[1] * 30] * 32, [[2] * 200] + [[2] * 100] * 31
    >>> packing_pays(prompts, completions, 10**6)
    True
    >>> smollm2 = ForwardCost(pair_weight=1 / 4275, varlen=False)
    >>> packing_pays(prompts, completions, 10**6, cost=smollm2)
    False
    >>> packing_pays(prompts, completions, 10**6, cost=replace(smollm2, varlen=True))
    True

    Where the attention takes a custom mask (``ForwardCost.bins``: SDPA, eager), the shared
    forward's completions share bins as long as the longest (``completion_bins``): 17 rows of
    200 instead of 32, fewer positions than the pack (3,430 against 4,260) even before attention:

    >>> packing_pays(prompts, completions, 10**6, cost=ForwardCost(bins=True))
    False
    """
    chosen = range(len(prompts)) if select is None else select
    packed_positions = sum(len(prompts[i]) + len(completions[i]) for i in chosen)
    packed_pairs = 0
    if cost.pair_weight:
        for rows in _packed_groups(prompts, completions, chosen, token_budget):
            lengths = [len(prompts[i]) + len(completions[i]) for i in rows]
            packed_pairs += sum(n * n for n in lengths) if cost.varlen else sum(lengths) ** 2
    shared_positions = shared_pairs = 0
    for rows in _padded_groups(prompts, completions, chosen, token_budget, group_prompts=True):
        distinct = len({tuple(prompts[i]) for i in rows})
        longest_prompt = max(len(prompts[i]) for i in rows)
        longest_completion = max(1, max(len(completions[i]) for i in rows))
        prompt_rows = distinct if distinct < len(rows) else len(rows)
        completion_rows = len(rows)
        if distinct < len(rows) and cost.bins:
            owners = [tuple(prompts[i]) for i in rows]
            owner_ids = [owners.index(o) for o in owners]
            lengths = [len(completions[i]) for i in rows]
            completion_rows = len(completion_bins(lengths, owner_ids, longest_completion))
        shared_positions += prompt_rows * longest_prompt + completion_rows * longest_completion
        shared_pairs += prompt_rows * longest_prompt**2
        shared_pairs += completion_rows * longest_completion * (longest_prompt + longest_completion)
    packed = packed_positions + cost.pair_weight * packed_pairs
    shared = shared_positions + cost.pair_weight * shared_pairs
    return packed < shared


def _pack_groups(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    chosen: Sequence[int] | range,
    token_budget: int,
    pad_id: int,
) -> list[MicroBatch]:
    """Cut pairs into packs of at most ``token_budget`` real tokens (first fit, longest first).

    A pair longer than the budget gets a pack of its own.
    """
    if any(len(prompts[i]) == 0 for i in chosen):
        raise ValueError("packed micro-batches need a non-empty prompt in every pair")
    packs = _packed_groups(prompts, completions, chosen, token_budget)
    return [
        _pack([prompts[i] for i in g], [completions[i] for i in g], tuple(g), pad_id) for g in packs
    ]


def _packed_groups(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    chosen: Sequence[int] | range,
    token_budget: int,
) -> list[list[int]]:
    """Return the rows of each pack (``_pack_groups``): first fit, longest first."""
    order = sorted(chosen, key=lambda i: -(len(prompts[i]) + len(completions[i])))
    packs: list[list[int]] = []
    sizes: list[int] = []
    for i in order:
        size = len(prompts[i]) + len(completions[i])
        fit = next((k for k, used in enumerate(sizes) if used + size <= token_budget), None)
        if fit is None:
            packs.append([i])
            sizes.append(size)
        else:
            packs[fit].append(i)
            sizes[fit] += size
    return packs


def _pack(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    rows: tuple[int, ...],
    pad_id: int,
) -> MicroBatch:
    """One (1, N) sequence of the pairs end to end; positions restart at 0 for each pair."""
    ids: list[int] = []
    positions: list[int] = []
    targets: list[int] = []
    for p, c in zip(prompts, completions):
        start = len(ids)
        ids += [*p, *c]
        positions += range(len(p) + len(c))
        targets += range(start + len(p) - 1, start + len(p) - 1 + len(c))
    padded = _pad([[pad_id]] * len(rows), completions, rows, pad_id)  # (B, C) completion layout
    sequence = torch.tensor([ids], dtype=torch.long)
    return MicroBatch(
        rows,
        sequence,
        torch.ones_like(sequence),
        torch.tensor([positions], dtype=torch.long),
        padded.completion_ids,
        padded.completion_mask,
        torch.tensor(targets, dtype=torch.long),
    )


def _pad(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    rows: tuple[int, ...],
    pad_id: int,
) -> MicroBatch:
    p_len = max(len(p) for p in prompts)
    c_len = max(1, max(len(c) for c in completions))
    batch = len(prompts)
    ids = torch.full((batch, p_len + c_len), pad_id, dtype=torch.long)
    attn = torch.zeros((batch, p_len + c_len), dtype=torch.long)
    for b, (p, c) in enumerate(zip(prompts, completions)):
        ids[b, p_len - len(p) : p_len] = torch.tensor(list(p), dtype=torch.long)
        ids[b, p_len : p_len + len(c)] = torch.tensor(list(c), dtype=torch.long)
        attn[b, p_len - len(p) : p_len + len(c)] = 1
    # Left padding shifts positions: count them from the first real token, as HF generate does.
    pos = (attn.cumsum(dim=1) - 1).clamp(min=0)
    return MicroBatch(rows, ids, attn, pos, ids[:, p_len:], attn[:, p_len:])


def completion_bins(
    lengths: Sequence[int], owners: Sequence[int], capacity: int
) -> list[list[int]]:
    """Rows of each bin: completions of one prompt end to end, at most ``capacity`` tokens a bin.

    First fit, longest first, per prompt (``owners``: the prompt of each row). With ``capacity``
    the longest completion, the bins never hold more token positions than the padded rows (one
    bin per row at worst) and never more attention pairs, so the shared-prompt forward runs its
    completions in bins without a cost model. Returns bins in order of their first row.

    >>> completion_bins([64, 20, 30, 64, 10, 50], [0, 0, 0, 1, 1, 1], 64)
    [[0], [2, 1], [3], [5, 4]]
    >>> completion_bins([5, 5], [0, 1], 64)  # different prompts never share a bin
    [[0], [1]]
    """
    bins: list[list[int]] = []
    used: list[int] = []
    bin_owner: list[int] = []
    for row in sorted(range(len(lengths)), key=lambda r: (-lengths[r], r)):
        fit = next(
            (
                k
                for k in range(len(bins))
                if bin_owner[k] == owners[row] and used[k] + lengths[row] <= capacity
            ),
            None,
        )
        if fit is None:
            bins.append([row])
            used.append(lengths[row])
            bin_owner.append(owners[row])
        else:
            bins[fit].append(row)
            used[fit] += lengths[row]
    return sorted(bins, key=min)


def pad_rows(rows: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    """Return per-token values (e.g. sampling logprobs) as a zero-padded (B, width) tensor."""
    out = torch.zeros((len(rows), width))
    for b, values in enumerate(rows):
        out[b, : len(values)] = torch.tensor(list(values), dtype=torch.float32)
    return out
