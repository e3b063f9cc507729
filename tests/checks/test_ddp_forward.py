"""The DDP forward passes that the hang checks record as broadcasting are those that block when a rank does not come.

On the real gloo group of the rank pools, every rank but one makes a forward pass while the last holds back
(tests/helpers/ddp_forward_tasks.py). A pass that blocks returns only after the late rank came; one that does not,
before. The named cases' expectations come from DDP's documented behaviour (torch 2.13's ``_pre_forward`` and
``Reducer::rebuild_buckets``, docs/internals.md), not from the code under test: the buckets are rebuilt, with a
broadcast, once, at the first forward pass in grad mode after a backward pass with gradient sync (with
``static_graph``, after the second; never with ``find_unused_parameters`` alone); the buffers are broadcast at each
forward pass with ``broadcast_buffers=True`` unless the previous pass ran without grad mode or gradient sync. The
property draws random models, steps and passes, at 2 and 3 ranks, and holds the verdict (``verdict.blocked_by``, the
waiting rank's facts against the early rank's) to what happened.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_ext._checks.verdict import blocked_by
from tests.helpers import search
from tests.helpers.ddp_forward_tasks import PROBES, STEPS

PLAIN = {"buffers": False, "find_unused_parameters": False, "static_graph": False, "broadcast_buffers": True}
NORM = {**PLAIN, "buffers": True}
STATIC = {**PLAIN, "static_graph": True}
# name: (model, steps on every rank, the pass the late rank holds back from, whether it blocks)
CASES: dict[str, tuple[dict[str, Any], tuple[str, ...], str, bool]] = {
    "first_pass": (PLAIN, (), "grad", False),
    "rebuild_after_a_synced_step": (PLAIN, ("step",), "grad", True),
    "rebuilt_once_only": (PLAIN, ("step", "step"), "grad", False),
    "rebuild_in_an_accumulating_pass": (PLAIN, ("step",), "no_sync", True),
    "no_rebuild_without_grad_mode": (PLAIN, ("step",), "no_grad", False),
    "no_rebuild_before_a_synced_backward": (PLAIN, ("accumulate",), "grad", False),
    "rebuild_after_accumulating_then_syncing": (PLAIN, ("accumulate", "step"), "grad", True),
    "find_unused_parameters_never_rebuilds": ({**PLAIN, "find_unused_parameters": True}, ("step",), "grad", False),
    "static_graph_not_after_its_first_iteration": (STATIC, ("step",), "grad", False),
    "static_graph_rebuilds_after_its_second": (STATIC, ("step", "step"), "grad", True),
    "buffers_at_the_first_pass": (NORM, (), "grad", True),
    "buffers_at_every_synced_pass": (NORM, ("step", "step"), "grad", True),
    "buffers_at_validation_s_first_pass": (NORM, ("step", "step"), "no_grad", True),
    "no_buffers_after_a_pass_without_grad_mode": (NORM, ("step", "step", "eval"), "no_grad", False),
    "no_buffers_after_an_accumulating_pass": (NORM, ("accumulate",), "no_grad", False),
    "broadcast_buffers_off": ({**NORM, "broadcast_buffers": False}, ("step", "step"), "grad", False),
}


def run(rank_pools: Any, world: int, example: dict[str, Any]) -> list[dict[str, Any]]:
    return rank_pools(world).run(
        "tests.helpers.ddp_forward_tasks:forward_alone", ({**example, "id": uuid.uuid4().hex},)
    )


def verdicts(outcomes: list[dict[str, Any]], late: int) -> dict[int, str | None]:
    """What the deadlock rule says of each early rank in its pass, against the late rank's facts as it held back."""
    waiting = [outcomes[late]["facts"]]
    return {
        rank: None if outcome["seen"] is None else blocked_by(waiting, outcome["seen"])
        for rank, outcome in enumerate(outcomes)
        if rank != late
    }


@pytest.mark.timeout(300)
@pytest.mark.parametrize("late", [0, 1])
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_pass_is_recorded_and_proven_blocked_exactly_when_it_blocks(rank_pools: Any, name: str, late: int) -> None:
    model, steps, probe, blocks = CASES[name]
    outcomes = run(rank_pools, 2, {**model, "steps": steps, "probe": probe, "late": late})
    early = outcomes[1 - late]
    assert early["blocked"] is blocks, early
    assert early["recorded"] == blocks, early
    assert verdicts(outcomes, late)[1 - late] == ("forward" if blocks else None)
    if blocks:  # the number the waiting rank's completed passes are compared with
        assert early["seen"].forward == outcomes[late]["facts"].forwards + 1


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("steps", "rebuild"), [(("step", "step"), False), (("step",), True)])
def test_at_3_ranks_a_rank_other_than_0_needs_only_rank_0_for_the_buffers(
    rank_pools: Any, steps: tuple[str, ...], rebuild: bool
) -> None:
    """Rank 1 holds back. Rank 0 blocks in every broadcast (it sends to rank 1 too). Rank 2 receives the buffers from
    rank 0, which went on into its pass too: it completes a pass that only broadcasts them, which is recorded but not
    proven; a rebuild's second broadcast waits for rank 0, so there it blocks, proven. Where rank 2's pass should not
    block, rank 1 holds back 5 s, so long that only a pass that blocks returns after it came."""
    hold = 0.5 if rebuild else 5.0  # a pass that does not block has long returned; one that blocks returns after
    outcomes = run(rank_pools, 3, {**NORM, "steps": steps, "probe": "grad", "late": 1, "hold": hold})
    said = verdicts(outcomes, 1)
    assert (outcomes[0]["blocked"], outcomes[0]["recorded"], said[0]) == (True, 1, "forward"), outcomes[0]
    expected = (True, 1, "forward") if rebuild else (False, 1, None)
    assert (outcomes[2]["blocked"], outcomes[2]["recorded"], said[2]) == expected, outcomes[2]


@st.composite
def examples(draw: st.DrawFn, world: int) -> dict[str, Any]:
    model = {key: draw(st.booleans()) for key in PLAIN}
    steps = draw(st.lists(st.sampled_from(STEPS), max_size=3))
    probe = draw(st.sampled_from(PROBES))
    trained = [step for step in [*steps, probe] if step not in ("eval", "no_grad")]
    if model["static_graph"] and trained and trained[0] in ("accumulate", "no_sync"):
        model["static_graph"] = False  # torch 2.13 does not support a static graph's first iteration within no_sync
    return {**model, "steps": steps, "probe": probe, "late": draw(st.integers(0, world - 1))}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [2, 3])
def test_property_the_verdict_proves_only_passes_that_block(rank_pools: Any, world: int) -> None:
    """At 2 ranks, recorded, proven and blocked coincide. At 3, a pass that blocks is recorded and a proven one
    blocks; a rank other than 0 whose pass only broadcasts buffers, with rank 0 in its pass too, completes it (rank 0
    sends), so it is not proven: it goes on into its backward pass, whose all-reduce the rule proves."""

    @settings(max_examples=search.examples(search.PER_SUITE_FIT))
    @given(example=examples(world))
    def check(example: dict[str, Any]) -> None:
        outcomes = run(rank_pools, world, example)
        late = example["late"]
        for rank, verdict in verdicts(outcomes, late).items():
            outcome = outcomes[rank]
            assert outcome["blocked"] <= bool(outcome["recorded"]), (rank, outcome)
            assert bool(verdict) <= outcome["blocked"], (rank, outcome, verdict)
            if world == 2:
                assert bool(verdict) == outcome["blocked"] == bool(outcome["recorded"]), (rank, outcome, verdict)

    check()


def test_the_named_cases_cover_both_outcomes_and_every_step_and_pass() -> None:
    assert {blocks for *_, blocks in CASES.values()} == {True, False}
    assert set(itertools.chain.from_iterable(steps for _, steps, _, _ in CASES.values())) == set(STEPS)
    assert {probe for _, _, probe, _ in CASES.values()} == set(PROBES)
