"""The ready strategies' surface, in one process: signatures, arguments, registry names, LightningCLI, bad input.

Lightning is the reference: its classes' signatures and its own registry entries (``ddp_spawn``'s start method) are
read from Lightning itself, never from lightning-ext.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import inspect
import re
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import pytest
from lightning.pytorch.strategies import (
    DDPStrategy,
    DeepSpeedStrategy,
    FSDPStrategy,
    ModelParallelStrategy,
    SingleDeviceStrategy,
    StrategyRegistry,
)

import lightning_ext
from lightning_ext import (
    AnyRank,
    Majority,
    PolicyDDPStrategy,
    PolicyFSDPStrategy,
    PolicyModelParallelStrategy,
    PolicyStrategyMixin,
    Quorum,
    available_policies,
)
from lightning_ext.policies import resolve_policy
from lightning_ext.strategies._options import StrategyOptions
from lightning_ext.strategies.deepspeed import PolicyDeepSpeedStrategy as _PolicyDeepSpeedStrategy

DEEPSPEED_INSTALLED = importlib.util.find_spec("deepspeed") is not None
needs_deepspeed = pytest.mark.skipif(not DEEPSPEED_INSTALLED, reason="DeepSpeed is not installed (GPU-only package)")
STRATEGIES_DOC = Path(__file__).parents[2] / "docs" / "strategies.md"


def _documented_options() -> dict[str, Any]:
    """The options and their defaults as docs/strategies.md states them (the table after its marker comment)."""
    text = STRATEGIES_DOC.read_text().split("<!-- the options:", 1)[1]
    rows = re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", text.split("\n\n", 1)[0], flags=re.MULTILINE)
    return {name: ast.literal_eval(default) for name, default in rows}


MIXIN_OPTIONS = _documented_options()
PAIRS = [
    (PolicyDDPStrategy, DDPStrategy),
    (PolicyFSDPStrategy, FSDPStrategy),
    (PolicyModelParallelStrategy, ModelParallelStrategy),
    (_PolicyDeepSpeedStrategy, DeepSpeedStrategy),
]
# Lightning's name -> our family; "ddp_spawn" etc. take Lightning's own start method from its registry entry
FAMILIES = {"ddp": "ddp", "ddp_spawn": "ddp_spawn", "ddp_fork": "ddp_fork", "ddp_notebook": "ddp_notebook"}


# ---- signatures and arguments --------------------------------------------------------------------------------------
@pytest.mark.both_packages
@pytest.mark.parametrize(("ours", "base"), PAIRS, ids=[base.__name__ for _, base in PAIRS])
def test_takes_every_base_argument_with_the_same_signature(ours: type, base: type) -> None:
    """Same names, order, kinds and defaults as Lightning's class; then only the mixin's keyword-only options."""
    theirs = list(inspect.signature(base.__init__).parameters.values())[1:]
    mine = list(inspect.signature(ours.__init__).parameters.values())[1:]
    positional = [p for p in theirs if p.kind is not inspect.Parameter.VAR_KEYWORD]
    assert [(p.name, p.kind, p.default) for p in mine[: len(positional)]] == [
        (p.name, p.kind, p.default) for p in positional
    ]
    rest = mine[len(positional) :]
    assert {p.name: p.default for p in rest if p.kind is inspect.Parameter.KEYWORD_ONLY} == MIXIN_OPTIONS
    var_keyword = [p.kind for p in theirs + rest if p.kind is inspect.Parameter.VAR_KEYWORD]
    assert len(var_keyword) in (0, 2)  # **kwargs exactly where Lightning's class has it
    assert len(rest) == len(MIXIN_OPTIONS) + len(var_keyword) // 2
    mixin = inspect.signature(PolicyStrategyMixin.__init__).parameters
    assert {name: mixin[name].default for name in MIXIN_OPTIONS} == MIXIN_OPTIONS
    assert [p.name for p in inspect.signature(ours).parameters.values()] == [p.name for p in mine]  # the class too


def test_the_documented_options_are_every_option_of_the_mixin_and_its_docstring() -> None:
    """The table in docs/strategies.md, the mixin's signature and its docstring's ``Args`` name the same options."""
    assert len(MIXIN_OPTIONS) >= 10, MIXIN_OPTIONS  # the table was found and read
    mixin = list(inspect.signature(PolicyStrategyMixin).parameters.values())
    assert [p.kind for p in (mixin[0], mixin[-1])] == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]
    assert {p.name: p.default for p in mixin[1:-1]} == MIXIN_OPTIONS
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in mixin[1:-1])
    arguments = (PolicyStrategyMixin.__doc__ or "").split("Args:")[1].split("Raises:")[0]
    documented = re.findall(r"^        (\w+): ", arguments, re.MULTILINE)
    assert documented == list(MIXIN_OPTIONS) == [field.name for field in dataclasses.fields(StrategyOptions)]


@pytest.mark.parametrize("ours", [ours for ours, _ in PAIRS], ids=[ours.__name__ for ours, _ in PAIRS])
def test_a_strategys_docstring_leaves_the_options_to_the_mixins(ours: type) -> None:
    """The options are listed once, in the mixin's docstring: a strategy's own names none of them (a partial list goes
    stale: ``PolicyDDPStrategy``'s once lacked ``log_sync``)."""
    named = set(re.findall(r"``(\w+)``", ours.__doc__ or "")) & set(MIXIN_OPTIONS)
    assert not named, f"{ours.__name__}'s docstring names {sorted(named)}: point to PolicyStrategyMixin instead"
    assert "PolicyStrategyMixin" in (ours.__doc__ or "")


@pytest.mark.both_packages
def test_a_user_strategy_without_an_init_gets_its_bases_signature_and_the_options() -> None:
    class MyDDP(DDPStrategy):
        def __init__(self, gradient_as_bucket_view: bool = True, timeout: timedelta = timedelta(minutes=5)) -> None:
            super().__init__(timeout=timeout, gradient_as_bucket_view=gradient_as_bucket_view)

    class PolicyMyDDP(PolicyStrategyMixin, MyDDP):  # type: ignore[misc]
        pass

    parameters = inspect.signature(PolicyMyDDP).parameters
    assert {name: p.default for name, p in list(parameters.items())[:2]} == {
        "gradient_as_bucket_view": True,
        "timeout": timedelta(minutes=5),
    }
    assert {name: p.default for name, p in list(parameters.items())[2:]} == MIXIN_OPTIONS
    strategy = PolicyMyDDP(False, timeout=timedelta(seconds=9), checkpoint_policy="majority")
    assert strategy._ddp_kwargs["gradient_as_bucket_view"] is False and strategy._timeout == timedelta(seconds=9)
    assert strategy.checkpoint_policy == Majority()
    with pytest.raises(TypeError, match="unexpected keyword argument 'static_graph'"):
        PolicyMyDDP(static_graph=True)


def test_a_strategy_parameter_named_like_an_option_is_a_type_error_at_class_definition() -> None:
    class Clashing(DDPStrategy):
        def __init__(self, hang_checks: int = 0) -> None:
            super().__init__()

    with pytest.raises(TypeError, match=r"Clashing\.__init__ has a parameter named .hang_checks."):

        class PolicyClashing(PolicyStrategyMixin, Clashing):  # type: ignore[misc]
            pass


@pytest.mark.both_packages
def test_fsdp_arguments_reach_fsdp() -> None:
    strategy = PolicyFSDPStrategy(
        sharding_strategy="SHARD_GRAD_OP",
        state_dict_type="sharded",
        cpu_offload=True,
        timeout=timedelta(seconds=7),
        limit_all_gathers=True,  # **kwargs, passed on to FSDP
        checkpoint_policy="majority",
    )
    assert isinstance(strategy, FSDPStrategy)
    assert strategy.sharding_strategy.name == "SHARD_GRAD_OP"
    assert strategy._state_dict_type == "sharded"
    assert strategy.cpu_offload.offload_params is True
    assert strategy._timeout == timedelta(seconds=7)
    assert strategy.kwargs["limit_all_gathers"] is True
    assert (strategy.checkpoint_policy, strategy.early_stopping_policy) == (Majority(), AnyRank())


@pytest.mark.both_packages
def test_model_parallel_arguments_reach_model_parallel_positionally() -> None:
    strategy = PolicyModelParallelStrategy(4, 2, False, "gloo", early_stopping_policy="mean")
    assert isinstance(strategy, ModelParallelStrategy)
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (4, 2)
    assert strategy._save_distributed_checkpoint is False
    assert strategy.process_group_backend == "gloo"
    assert strategy.early_stopping_policy == resolve_policy("mean")


@pytest.mark.both_packages
def test_model_parallel_takes_no_argument_that_model_parallel_does_not() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'find_unused_parameters'"):
        PolicyModelParallelStrategy(find_unused_parameters=True)  # type: ignore[call-arg]


# ---- registry names ------------------------------------------------------------------------------------------------
@pytest.mark.both_packages
@pytest.mark.parametrize("lightning_name", sorted(FAMILIES))
def test_ddp_launcher_names_use_lightnings_start_method(lightning_name: str) -> None:
    start_method = StrategyRegistry[lightning_name]["init_params"]["start_method"]  # Lightning's own entry
    for policy in [*available_policies(), "policy", "quorum_50", "quorum_75", "quorum_90"]:
        strategy = StrategyRegistry.get(f"{FAMILIES[lightning_name]}_{policy}")
        assert type(strategy) is PolicyDDPStrategy
        assert strategy._start_method == start_method
        expected = ("all", "any") if policy == "policy" else (policy, policy)
        assert (strategy.checkpoint_policy, strategy.early_stopping_policy) == tuple(map(resolve_policy, expected))


@pytest.mark.both_packages
def test_launcher_names_build_a_trainer() -> None:
    trainer = L.Trainer(strategy="ddp_fork_min", accelerator="cpu", devices=2)
    assert isinstance(trainer.strategy, PolicyDDPStrategy) and trainer.strategy._start_method == "fork"
    assert trainer.strategy.checkpoint_policy == resolve_policy("min")


@pytest.mark.both_packages
def test_fsdp_names_build_the_strategy_and_are_refused_on_cpu_like_fsdp() -> None:
    for policy in available_policies():
        strategy = StrategyRegistry.get(f"fsdp_{policy}")
        assert type(strategy) is PolicyFSDPStrategy
        assert strategy.checkpoint_policy == strategy.early_stopping_policy == resolve_policy(policy)
    errors = []
    for name in ("fsdp", "fsdp_majority"):
        with pytest.raises(ValueError, match="requires a GPU accelerator") as caught:
            L.Trainer(strategy=name, accelerator="cpu", devices=2)
        errors.append(str(caught.value))
    assert errors[0] == errors[1]


@pytest.mark.both_packages
def test_model_parallel_has_no_registry_name_as_in_lightning() -> None:
    assert not any("model_parallel" in name for name in StrategyRegistry)


@pytest.mark.both_packages
def test_registration_is_idempotent() -> None:
    before = {name: dict(entry) for name, entry in StrategyRegistry.items()}
    PolicyDDPStrategy.register_strategies(StrategyRegistry)
    PolicyFSDPStrategy.register_strategies(StrategyRegistry)
    _PolicyDeepSpeedStrategy.register_strategies(StrategyRegistry)
    assert {name: dict(entry) for name, entry in StrategyRegistry.items()} == before
    assert FSDPStrategy.get_registered_strategies().count("fsdp_majority") == 1


# ---- DeepSpeed -----------------------------------------------------------------------------------------------------
@pytest.mark.both_packages
@pytest.mark.skipif(DEEPSPEED_INSTALLED, reason="checks the error raised where DeepSpeed is missing")
def test_deepspeed_missing_is_a_named_import_error() -> None:
    message = r"needs the `deepspeed` package, which is not installed\. Install it with `pip install deepspeed`"
    with pytest.raises(ImportError, match=message):
        lightning_ext.PolicyDeepSpeedStrategy  # noqa: B018
    with pytest.raises(ImportError, match=message):
        from lightning_ext.strategies import PolicyDeepSpeedStrategy  # noqa: F401
    for name in ("deepspeed_policy", "deepspeed_majority"):
        assert name in StrategyRegistry
        with pytest.raises(ImportError, match=message):
            L.Trainer(strategy=name, accelerator="cpu", devices=2)
    for module in ("lightning_ext", "lightning_ext.strategies"):  # star imports still work without it
        namespace: dict[str, Any] = {}
        exec(f"from {module} import *", namespace)
        assert "PolicyDDPStrategy" in namespace and "PolicyDeepSpeedStrategy" not in namespace


@needs_deepspeed
def test_deepspeed_names_build_the_strategy() -> None:
    strategy = StrategyRegistry.get("deepspeed_majority")
    assert type(strategy) is lightning_ext.PolicyDeepSpeedStrategy
    assert strategy.checkpoint_policy == Majority()
    assert lightning_ext.PolicyDeepSpeedStrategy(stage=3).config["zero_optimization"]["stage"] == 3


# ---- LightningCLI --------------------------------------------------------------------------------------------------
CLI_STRATEGIES = {
    "fsdp": """
        class_path: lightning_ext.PolicyFSDPStrategy
        init_args:
          sharding_strategy: SHARD_GRAD_OP
          state_dict_type: sharded
          checkpoint_policy: majority
          early_stopping_policy:
            class_path: lightning_ext.Quorum
            init_args:
              k: 0.75
          per_rank_metrics: true
    """,
    "model_parallel": """
        class_path: lightning_ext.PolicyModelParallelStrategy
        init_args:
          data_parallel_size: 2
          tensor_parallel_size: 1
          save_distributed_checkpoint: false
          checkpoint_policy: mean
          early_stopping_policy:
            class_path: lightning_ext.Quorum
            init_args:
              k: 2
          per_rank_metrics: true
    """,
    "ddp": """
        class_path: lightning_ext.PolicyDDPStrategy
        init_args:
          start_method: spawn
          find_unused_parameters: true
          checkpoint_policy: mean
          early_stopping_policy:
            class_path: lightning_ext.Quorum
            init_args:
              k: 2
          hang_checks: debug
          stall_timeout: 30
    """,
    "user_ddp": """
        class_path: tests.helpers.strategy_scenarios.PolicyTunedDDPStrategy
        init_args:
          start_method: spawn
          static_graph: true
          checkpoint_policy: mean
          early_stopping_policy:
            class_path: lightning_ext.Quorum
            init_args:
              k: 2
          uneven_batches: truncate
    """,
    "notebook_name": "ddp_notebook_majority",
}


@pytest.mark.parametrize("kind", sorted(CLI_STRATEGIES))
def test_lightning_cli_yaml_config(tmp_path: Path, kind: str) -> None:
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

    strategy = textwrap.indent(textwrap.dedent(CLI_STRATEGIES[kind]).strip(), "    ")
    config = tmp_path / "config.yaml"
    config.write_text(f"trainer:\n  accelerator: cpu\n  devices: 2\n  logger: false\n  strategy:\n{strategy}\n")
    if kind == "notebook_name":
        config.write_text(config.read_text().replace("strategy:\n    ", "strategy: "))
    built = LightningCLI(BoringModel, BoringDataModule, run=False, args=["--config", str(config)]).trainer.strategy
    if kind == "fsdp":
        assert type(built) is PolicyFSDPStrategy
        assert built.sharding_strategy.name == "SHARD_GRAD_OP" and built._state_dict_type == "sharded"
    elif kind == "model_parallel":
        assert type(built) is PolicyModelParallelStrategy
        assert (built._data_parallel_size, built._tensor_parallel_size) == (2, 1)
        assert built._save_distributed_checkpoint is False
    elif kind in ("ddp", "user_ddp"):
        assert type(built).__name__ == {"ddp": "PolicyDDPStrategy", "user_ddp": "PolicyTunedDDPStrategy"}[kind]
        assert built._start_method == "spawn"
        given = {"find_unused_parameters": True} if kind == "ddp" else {"static_graph": True}
        assert {name: built._ddp_kwargs[name] for name in given} == given  # DistributedDataParallel's, via **kwargs
        expected = ("debug", "error") if kind == "ddp" else (True, "truncate")
        assert (built.hang_checks, built.uneven_batches) == expected
        assert built.stall_options.stall_timeout == (30 if kind == "ddp" else "auto")
    else:
        assert type(built) is PolicyDDPStrategy and built._start_method == "fork"
        assert built.checkpoint_policy == built.early_stopping_policy == Majority()
        return
    policies = {"fsdp": "majority", "model_parallel": "mean", "ddp": "mean", "user_ddp": "mean"}
    assert built.checkpoint_policy == resolve_policy(policies[kind])
    assert built.early_stopping_policy == (Quorum(0.75) if kind == "fsdp" else Quorum(2))
    assert (built.per_rank_metrics is not None) == (kind in ("fsdp", "model_parallel"))


# ---- the mixin on a strategy it cannot work with -------------------------------------------------------------------
@pytest.mark.both_packages
def test_mixin_on_a_single_device_strategy_is_a_type_error() -> None:
    class SingleWithPolicies(PolicyStrategyMixin, SingleDeviceStrategy):  # type: ignore[misc]
        pass

    with pytest.raises(TypeError, match="SingleWithPolicies applies PolicyStrategyMixin to a strategy that is not a"):
        SingleWithPolicies(device="cpu")


def _with_decision(function: Any) -> type:
    """A DDP strategy whose ``reduce_boolean_decision`` is ``function``, with the mixin applied."""
    user_ddp = type("UserDDP", (DDPStrategy,), {"reduce_boolean_decision": function})
    return type("PolicyUserDDP", (PolicyStrategyMixin, user_ddp), {})


def _no_all(self: Any, decision: bool) -> bool:
    return decision


def _required_group(self: Any, decision: bool, all: bool = True, *, group: Any) -> bool:
    return decision


@pytest.mark.parametrize(
    ("function", "problem"),
    [
        pytest.param(
            _no_all, r"has the signature \(self: 'Any', decision: 'bool'\) -> 'bool'", marks=pytest.mark.both_packages
        ),
        (_required_group, r"has the signature \(self: 'Any', decision: 'bool', all: 'bool' = True, \*, group: 'Any'\)"),
        (property(lambda self: None), "is a property, not a method"),
    ],
    ids=["no_all", "required_keyword", "property"],
)
def test_incompatible_reduce_boolean_decision_is_a_type_error_at_construction(function: Any, problem: str) -> None:
    strategy_class = _with_decision(function)  # defining the class is fine
    with pytest.raises(TypeError, match=rf"UserDDP\.reduce_boolean_decision {problem}") as caught:
        strategy_class()
    assert "PolicyStrategyMixin needs one that Lightning's callbacks can call as" in str(caught.value)
    assert "reduce_boolean_decision(decision, all=False)" in str(caught.value)


def _string_annotations(self: Any, decision: "bool", all: "bool" = True) -> "bool":  # noqa: UP037
    return decision  # as written in a module with `from __future__ import annotations`


def _extra_options(self: Any, decision: bool, all: bool = True, **kwargs: Any) -> bool:
    return decision


@pytest.mark.parametrize(
    "function",
    [_string_annotations, _extra_options, staticmethod(lambda decision, all=True: decision)],
    ids=["string_annotations", "extra_options", "staticmethod"],
)
def test_compatible_reduce_boolean_decision_is_accepted(function: Any) -> None:
    strategy = _with_decision(function)(checkpoint_policy="majority")
    assert strategy.checkpoint_policy == Majority()


@pytest.mark.both_packages
def test_mixin_after_the_strategy_is_a_type_error_at_class_definition() -> None:
    with pytest.raises(TypeError, match=r"put the mixin first: class Backwards\(PolicyStrategyMixin, DDPStrategy\)"):

        class Backwards(DDPStrategy, PolicyStrategyMixin):  # type: ignore[misc]
            pass


@pytest.mark.both_packages
def test_subclass_of_a_ready_strategy_is_accepted() -> None:
    class MyFSDP(PolicyFSDPStrategy):
        pass

    assert MyFSDP(checkpoint_policy="any").checkpoint_policy == AnyRank()


def test_a_strategy_pickles_as_start_method_spawn_sends_it_to_each_rank() -> None:
    """``start_method="spawn"`` pickles the strategy (with the trainer) to each rank: no lambda may hide in it."""
    import pickle

    strategy = lightning_ext.PolicyDDPStrategy(start_method="spawn", checkpoint_policy="all")
    copy = pickle.loads(pickle.dumps(strategy))
    assert type(copy) is lightning_ext.PolicyDDPStrategy and copy.checkpoint_policy == strategy.checkpoint_policy
