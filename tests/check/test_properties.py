"""A property: random programs from a small grammar of rank guards and calls; the findings the grammar expects.

A program is a LightningModule or a Callback whose hook is a sequence of blocks: a call, a call under a rank guard
(its branch or its ``else``), under a condition that is the same on every rank, after an early ``return`` or a
``continue`` under a rank guard, through a helper method (called under a guard, or decorated with
``@rank_zero_only``), with a ``# noqa`` of the right or another code. The grammar knows which calls some ranks make
and the others do not, and what each call is; the check must find exactly those, on their lines. The expectations
come from the grammar alone, never from the check.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from lightning_ext.check import check_source

# (guard's set-up line or "", condition): each reads the rank; {m} is the module, {t} the trainer
GUARDS = (
    ("", "{t}.is_global_zero"),
    ("", "not {t}.is_global_zero"),
    ("", "{m}.global_rank == 0"),
    ("", "{t}.local_rank != 0"),
    ("", "{t}.node_rank == 0 and {t}.local_rank == 0"),
    ("", "dist.get_rank() == 0"),
    ("", 'os.environ.get("RANK", "0") == "0"'),
    ("", 'int(os.environ["LOCAL_RANK"]) > 0'),
    ("", "rank_zero_only.rank == 0"),
    ("trainer_alias = {t}", "trainer_alias.global_rank == 0"),
    ("is_zero = {t}.is_global_zero", "is_zero"),
    ("rank = {m}.global_rank", "rank != 0"),
)
# conditions that are the same on every rank
NEUTRAL = ("{t}.current_epoch > 1", "{t}.global_step % 2 == 0", "{t}.world_size > 1", "{t}.sanity_checking")
# (statement, its code where some ranks make it, its code where every rank does)
CALLS = (
    ('{m}.log("k", 1.0, sync_dist=True)', "LX101", None),
    ('{m}.log("k", 1.0, sync_dist=True, rank_zero_only=True)', None, None),
    ('{m}.log("k", 1.0)', None, None),
    ('{m}.log("k", 1.0, sync_dist=False)', None, None),
    ('{m}.log_dict({{f"k_{{{m}.global_rank}}": 1.0}}, sync_dist=True)', "LX101", "LX103"),
    ('{m}.log("k_" + str({t}.global_rank), 1.0, sync_dist=True)', "LX101", "LX103"),
    ('{m}.log("k", self.mean, on_epoch=True)', "LX102", None),
    ("print({t}.log_dir)", "LX201", None),
    ("print({t}.logger.log_dir)", None, None),
    ('{t}.save_checkpoint("manual.ckpt")', "LX202", None),
    ("{t}.strategy.barrier()", "LX203", None),
    ("{t}.strategy.broadcast(1)", "LX203", None),
    ("{t}.strategy.reduce(torch.ones(1))", "LX203", None),
    ("{m}.all_gather(torch.ones(1))", "LX204", None),
    ("{t}.strategy.all_gather(torch.ones(1))", "LX204", None),
    ("dist.all_reduce(torch.ones(1))", "LX205", None),
    ("dist.broadcast_object_list([1])", "LX205", None),
    ("dist.all_gather_single(torch.zeros(2), torch.ones(1))", "LX205", None),
    ('print("rank zero")', None, None),
    ('open("notes.txt", "w").close()', None, None),
)
# (a LightningModule's hook, a Callback's hook, the arguments after the module's or the callback's)
HOOKS = (
    ("on_train_epoch_end", "on_train_epoch_end", ""),
    ("on_validation_epoch_end", "on_validation_epoch_end", ""),
    ("on_test_epoch_end", "on_test_epoch_end", ""),
    ("training_step", "on_train_batch_end", ", batch, batch_idx"),
    ("validation_step", "on_validation_batch_end", ", batch, batch_idx"),
    ("test_step", "on_test_batch_end", ", batch, batch_idx"),
)
HEADER = """import os

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_only
from torchmetrics import MeanMetric

"""


@dataclass
class Program:
    """A program being written: its lines, and the ``(line, code)`` findings the grammar expects."""

    callback: bool
    lines: list[str] = field(default_factory=list)
    expected: set[tuple[int, str]] = field(default_factory=set)
    helpers: list[list[str]] = field(default_factory=list)

    def format(self, text: str) -> str:
        return text.format(m="pl_module" if self.callback else "self", t="trainer" if self.callback else "self.trainer")

    def add(self, indent: int, text: str) -> int:
        self.lines.append(" " * indent + self.format(text))
        return len(self.lines)

    def call(self, indent: int, call: tuple[str, str | None, str | None], guarded: bool, noqa: str | None) -> None:
        statement, some_ranks, every_rank = call
        code = some_ranks if guarded else every_rank
        comment = f"  # noqa: {code if noqa == 'right' else 'LX999'}" if noqa is not None and code else ""
        line = self.add(indent, statement + comment)
        if code is not None and noqa != "right":
            self.expected.add((line, code))


def blocks() -> st.SearchStrategy[tuple]:
    call = st.sampled_from(CALLS)
    noqa = st.sampled_from([None, None, None, "right", "wrong"])
    guard = st.sampled_from(GUARDS)
    return st.one_of(
        st.tuples(st.just("plain"), call, noqa),
        st.tuples(st.just("if"), guard, st.lists(st.tuples(call, noqa), min_size=1, max_size=3)),
        st.tuples(st.just("else"), guard, st.lists(st.tuples(call, noqa), min_size=1, max_size=3)),
        st.tuples(
            st.just("neutral"), st.sampled_from(NEUTRAL), st.lists(st.tuples(call, noqa), min_size=1, max_size=2)
        ),
        st.tuples(st.just("neutral_return"), st.sampled_from(NEUTRAL)),
        st.tuples(st.just("return"), guard),
        st.tuples(st.just("continue"), guard, st.lists(st.tuples(call, noqa), min_size=1, max_size=2)),
        st.tuples(st.just("helper"), st.one_of(st.none(), guard), st.lists(st.tuples(call, noqa), max_size=2)),
        st.tuples(st.just("rank_zero_only"), st.lists(st.tuples(call, noqa), min_size=1, max_size=2)),
    )


def write(callback: bool, hook: tuple[str, str, str], body: list[tuple]) -> Program:
    """The program, and the findings its grammar expects."""
    program = Program(callback)
    program.lines += HEADER.splitlines()
    program.add(0, "class Hooks(L.Callback):" if callback else "class Model(L.LightningModule):")
    program.add(4, "def __init__(self):")
    program.add(8, "super().__init__()")
    program.add(8, "self.mean = MeanMetric()")
    if callback:
        program.add(
            4,
            f"def {hook[1]}(self, trainer, pl_module, outputs{hook[2]}):"
            if hook[2]
            else f"def {hook[1]}(self, trainer, pl_module):",
        )
    else:
        program.add(4, f"def {hook[0]}(self{hook[2]}):")
    arguments = "trainer, pl_module" if callback else ""
    guarded = False  # after a guarded early return, the rest of the hook
    for kind, *parts in body:
        if kind == "plain":
            program.call(8, parts[0], guarded, parts[1])
        elif kind in ("if", "else"):
            setup, condition = parts[0]
            if setup:
                program.add(8, setup)
            program.add(8, f"if {condition}:")
            if kind == "else":
                program.add(12, "pass")
                program.add(8, "else:")
            for call, noqa in parts[1]:
                program.call(12, call, True, noqa)
        elif kind == "neutral":
            program.add(8, f"if {parts[0]}:")
            for call, noqa in parts[1]:
                program.call(12, call, guarded, noqa)
        elif kind in ("neutral_return", "return"):
            condition = parts[0] if kind == "neutral_return" else parts[0][1]
            if kind == "return" and parts[0][0]:
                program.add(8, parts[0][0])
            program.add(8, f"if {condition}:")
            program.add(12, "return")
            guarded = guarded or kind == "return"
        elif kind == "continue":
            setup, condition = parts[0]
            if setup:
                program.add(8, setup)
            program.add(8, "for _ in range(2):")
            program.add(12, f"if {condition}:")
            program.add(16, "continue")
            for call, noqa in parts[1]:
                program.call(12, call, True, noqa)
        else:  # a helper method: called under a guard (or not), or decorated with @rank_zero_only
            name = f"_helper{len(program.helpers)}"
            guard = parts[0] if kind == "helper" else None
            under = guarded or guard is not None or kind == "rank_zero_only"
            if guard is not None:
                if guard[0]:
                    program.add(8, guard[0])
                program.add(8, f"if {guard[1]}:")
                program.add(12, f"self.{name}({arguments})")
            else:
                program.add(8, f"self.{name}({arguments})")
            program.helpers.append([name, kind, under, parts[-1]])
    program.add(8, "return None")
    for name, kind, under, calls in program.helpers:
        if kind == "rank_zero_only":
            program.add(4, "@rank_zero_only")
        program.add(4, f"def {name}(self{', ' + arguments if arguments else ''}):")
        for call, noqa in calls:
            program.call(8, call, under, noqa)
        program.add(8, "return None")
    return program


@given(
    callback=st.booleans(),
    hook=st.sampled_from(HOOKS),
    body=st.lists(blocks(), min_size=1, max_size=6),
)
def test_the_check_finds_what_the_grammar_expects(
    callback: bool, hook: tuple[str, str, str], body: list[tuple]
) -> None:
    program = write(callback, hook, body)
    source = "\n".join(program.lines) + "\n"
    compile(source, "<program>", "exec")  # the grammar writes Python
    found = {(finding.line, finding.code) for finding in check_source(source)}
    assert found == program.expected, source
