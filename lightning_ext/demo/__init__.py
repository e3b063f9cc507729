"""``python -m lightning_ext.demo``: every policy on a tiny DDP run, then two pitfalls that freeze stock DDP."""
