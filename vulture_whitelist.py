"""What frameworks call or read by name, which vulture cannot see; ``make lint`` runs vulture with this file."""

# Lightning calls these hooks of a LightningModule or a Callback (the demo's models, the benchmarks' callback)
_.training_step
_.validation_step
_.on_validation_epoch_end
_.on_train_batch_start
_.train_dataloader
_.val_dataloader
_.configure_optimizers
# Lightning reads these: a strategy's registry name, the callbacks' and trainer's state that lightning-ext sets, and
# what the callbacks read from and call on the tests' and benchmarks' trainer stand-in
_.strategy_name
_.global_step
_.save_checkpoint
_.kth_value
_.best_model_score
_.best_score
_.wait_count
_.stopping_reason
_.val_check_batch
_.reduce_boolean_decision
# Lightning's Logger interface, which RankMetricsLogger implements
_.log_hyperparams
_.finalize
# parameters that a protocol names (Lightning's hooks and save_checkpoint, the context-manager protocol)
_.pl_module
_.params
_.weights_only
_.exc_type
_.tb
# importlib calls this on the loaders of the modules compiled for pytorch_lightning (_packages/mirror.py)
_.create_module
# Python calls these: a module's __getattr__/__dir__ (PEP 562), and the functions registered with atexit
_.__getattr__
_.__dir__
_._stop_live_watchdogs
_._close_writers
# inspect.signature reads a function's __signature__ (the strategies' generated signatures, strategies/_options.py)
_.__signature__
# a column of the straggler verdict's table (Straggler's fields), read by name in the summaries' JSON and CSV
_.waited_s
# written to the benchmark's JSON through dataclasses.asdict
_.mean_us
_.samples
# public API used by users and the tests, not by lightning-ext itself
_.for_rank  # RankMetricsWriter.for_rank
_.rows_logged  # RankMetricsLogger.rows_logged, read by tests/helpers/scripts/killed_rank.py
# Lightning's own state, set by lightning-ext and read by Lightning's loops and users' callbacks
_.received_sigterm  # _SignalConnector.received_sigterm, set by the coordinated stop (_preemption/stop.py)
# torch's gloo reads these options of a group it creates (the checks' pair groups, _collective.CheckChannel.connect)
_._threads
