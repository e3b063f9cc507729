"""What the check knows of Lightning and torch by name: the collective calls, the rank sources, the hooks, the bases."""

from __future__ import annotations

from lightning_ext._torch_collectives import COLLECTIVES

__all__ = [
    "CALLBACK_BASES",
    "COLLECTIVE_NAMES",
    "LIGHTNING_PACKAGES",
    "LOG_METHODS",
    "MODULE_BASES",
    "NO_LOGGING_HOOKS",
    "RANK_ATTRIBUTES",
    "RANK_ENVIRONMENT",
    "RANK_FUNCTIONS",
    "RANK_WORDS",
    "STEP_HOOKS",
    "STRATEGY_CODES",
    "TORCH_COLLECTIVES",
    "TORCH_DISTRIBUTED",
]

# the torch.distributed functions that every rank of the group must call: the hang checks count the same (one list)
TORCH_DISTRIBUTED = "torch.distributed"
TORCH_COLLECTIVES = frozenset(COLLECTIVES)
# a Lightning strategy's collectives (``trainer.strategy.<name>``), each with its code
STRATEGY_CODES = {
    "barrier": "LX203",
    "broadcast": "LX203",
    "reduce": "LX203",
    "reduce_boolean_decision": "LX203",
    "all_gather": "LX204",
}
# the names of every collective call: a value passed through one is the same on every rank
COLLECTIVE_NAMES = TORCH_COLLECTIVES | set(STRATEGY_CODES) | {"save_checkpoint"}
LOG_METHODS = ("log", "log_dict")

# where a value that differs between the ranks comes from
RANK_ATTRIBUTES = frozenset({"is_global_zero", "global_rank", "local_rank", "node_rank"})
RANK_FUNCTIONS = frozenset({f"{TORCH_DISTRIBUTED}.get_rank", f"{TORCH_DISTRIBUTED}.get_node_local_rank"})
RANK_ENVIRONMENT = frozenset(
    {"RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID"}
)
# every rank source holds one of these words: a file without any holds no finding (tests/check/test_catalogue.py)
RANK_WORDS = ("rank", "RANK", "is_global_zero", "SLURM_")

# Lightning's packages, and the base classes of the classes the check reads
LIGHTNING_PACKAGES = ("lightning", "pytorch_lightning")
MODULE_BASES = frozenset({"LightningModule"})
CALLBACK_BASES = frozenset({"Callback"})

# the hooks whose self.log defaults to on_step=True, on_epoch=False (Lightning's _FxValidator): a metric object
# logged there is not computed, so not synced, unless on_epoch=True
STEP_HOOKS = frozenset(
    {
        "training_step",
        "on_train_batch_start",
        "on_train_batch_end",
        "on_before_backward",
        "backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "optimizer_step",
        "configure_gradient_clipping",
        "clip_gradients",
        "on_before_zero_grad",
        "optimizer_zero_grad",
    }
)
# the hooks where self.log raises on every rank that calls it (Lightning's _FxValidator): not a hang
NO_LOGGING_HOOKS = frozenset(
    {
        "configure_callbacks",
        "configure_model",
        "configure_optimizers",
        "configure_sharded_model",
        "load_state_dict",
        "lr_scheduler_step",
        "on_after_batch_transfer",
        "on_before_batch_transfer",
        "on_exception",
        "on_fit_end",
        "on_fit_start",
        "on_load_checkpoint",
        "on_predict_batch_end",
        "on_predict_batch_start",
        "on_predict_end",
        "on_predict_epoch_end",
        "on_predict_epoch_start",
        "on_predict_start",
        "on_sanity_check_end",
        "on_sanity_check_start",
        "on_save_checkpoint",
        "on_test_end",
        "on_test_model_eval",
        "on_test_model_train",
        "on_train_end",
        "on_validation_end",
        "on_validation_model_eval",
        "on_validation_model_train",
        "on_validation_model_zero_grad",
        "predict_step",
        "prepare_data",
        "setup",
        "state_dict",
        "teardown",
        "test_dataloader",
        "train_dataloader",
        "transfer_batch_to_device",
        "val_dataloader",
    }
)
