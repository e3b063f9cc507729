"""Set-up mistakes in real ``Trainer.fit`` runs: caught before the first batch, the same error on every rank."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.pool import RankFailure

pytestmark = pytest.mark.slow
FIT = "tests.helpers.setup_scenarios:fit"


def same_error_everywhere(raised: RankFailure, world: int) -> str:
    messages = raised.messages()
    assert sorted(messages) == list(range(world)), f"not every rank raised: {messages}"
    assert len(set(messages.values())) == 1, f"ranks raised different errors: {messages}"
    return next(iter(messages.values()))


def test_a_generator_on_another_device_on_one_rank_is_one_error_on_every_rank(rank_pools: Any, tmp_path: Any) -> None:
    pool = rank_pools(2)
    with pytest.raises(RankFailure) as raised:
        pool.run(FIT, (str(tmp_path), "plain"), (str(tmp_path), "cuda_generator"), timeout=60)
    message = same_error_everywhere(raised.value, 2)
    assert message.startswith("DataLoaderSetupError: A dataloader would fail at its first batch")
    assert "  rank 1: the train dataloader (LoaderModule.train_dataloader, setup_scenarios.py:" in message
    assert "its DataLoader generator is on cuda:0 and draws its seed on cpu" in message
    assert "PyTorch would raise \"Expected a 'cpu' device type for generator but found 'cuda'\"" in message
    assert 'which Lightning reports as "Please call `iter(combined_loader)` first"' in message
    assert "Fix: drop the generator, or make it a CPU one: torch.Generator().manual_seed(seed)" in message
    # a sampler's own generator, kept because the user samples per rank (use_distributed_sampler=False)
    with pytest.raises(RankFailure) as raised:
        pool.run(FIT, (str(tmp_path), "cuda_sampler_generator"), distributed_sampler=False, timeout=60)
    message = same_error_everywhere(raised.value, 2)
    assert "  ranks 0 and 1: the train dataloader" in message
    assert "its sampler (RandomSampler) permutes on cpu with its generator on cuda:0" in message


def test_a_run_on_another_default_device_fails_before_its_first_batch_where_stock_hides_why(
    rank_pools: Any, tmp_path: Any
) -> None:
    """A ``with torch.device(...)`` block around ``fit`` (what ``trainer.init_module()`` does on a GPU): the samplers
    draw on that device. On CPU, ``meta`` shows it: stock ends in Lightning's "Please call `iter(combined_loader)`
    first", ours names the cause before the first batch."""
    pool = rank_pools(2)
    with pytest.raises(RankFailure) as raised:
        pool.run(FIT, (str(tmp_path), "shuffle"), strategy="stock", around="meta", timeout=60)
    assert all("Please call `iter(combined_loader)` first" in m for m in raised.value.messages().values())
    with pytest.raises(RankFailure) as raised:
        pool.run(FIT, (str(tmp_path), "shuffle"), around="meta", timeout=60)
    message = same_error_everywhere(raised.value, 2)
    assert "its sampler (DistributedSampler, shuffle=True) permutes on meta with a CPU generator" in message
    assert "The default device is meta (torch.set_default_device, or a `with torch.device(...)` block" in message


def test_correct_programs_run_unchanged_and_each_loader_is_checked_once(rank_pools: Any, tmp_path: Any) -> None:
    pool = rank_pools(2)
    cases: list[tuple[str, dict[str, Any]]] = [
        ("cpu_generator", {}),
        ("own_sampler", {"distributed_sampler": False}),  # its generator says cuda, but it draws right: not judged
        ("shuffle", {"around": "model_only"}),  # init_module around the model only
        ("shuffle", {"validate": True, "max_epochs": 3}),
        ("shuffle", {"validate": True, "max_epochs": 3, "reload": True}),
    ]
    for loader, options in cases:
        results = pool.run(FIT, (str(tmp_path), loader), timeout=60, **options)
        for result in results:
            epochs = options.get("max_epochs", 1)
            assert result["steps"] == epochs * (2 if options.get("distributed_sampler", True) else 4), (loader, options)
            assert result["warnings"] == [], (loader, options)
            # one check per dataloader the hooks gave, whatever the number of epochs and validation runs
            assert result["checked"] == result["requested"], (loader, options, result)
    assert results[0]["requested"] == 6  # reloaded: a train and a val dataloader every epoch


def test_a_run_inside_init_module_warns_that_it_is_for_the_model_only(rank_pools: Any, tmp_path: Any) -> None:
    results = rank_pools(2).run(FIT, (str(tmp_path), "shuffle"), around="init_module", timeout=60)
    assert [result["steps"] for result in results] == [2, 2]  # on CPU it runs
    (warning,) = results[0]["warnings"]
    assert warning.startswith("trainer.fit() runs inside `with trainer.init_module():` on ranks 0 and 1")
    assert "init_module is for building the model only" in warning and "(the default device there is cpu)" in warning
    assert results[1]["warnings"] == []  # said once, by rank 0
