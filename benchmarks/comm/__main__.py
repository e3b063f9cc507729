"""``python -m benchmarks.comm``: lightning-ext's communication overhead against stock Lightning, in one run.

Measures, on ranks it launches itself (gloo on CPU at each ``--world-sizes``, plus a small GPU part where CUDA is
available): the latency of every decision subject (stock and each policy, checkpoint and early-stopping paths,
interleaved), the collectives each makes, the training-step time and collectives per logging step with per-rank
metrics against stock, and the absolute cost of one per-rank row in microseconds. Writes ``<out>/<machine>.json``,
``.md`` and ``.png`` and prints the table, the per-rank row cost and the targets.
See ``benchmarks/README.md``.
"""

import argparse
import re
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from benchmarks.comm.chart import write_chart
from benchmarks.comm.decisions import COUNT_ROUNDS
from benchmarks.comm.gpu import gpu_sessions
from benchmarks.comm.launch import SessionFailed, run_session
from benchmarks.comm.plan import FULL, SMOKE, Counts, SessionSpec, plan_sessions, progress_units, session_timeout_s
from benchmarks.comm.report import build_rows, check_targets, markdown, metadata, write_json
from benchmarks.comm.row_cost import record_costs, row_costs
from benchmarks.comm.session import SessionResult
from benchmarks.comm.stall_cost import stall_costs
from benchmarks.comm.sync_cost import sync_costs
from benchmarks.comm.training import BASELINES, CONFIGS, ROW_LOOPS_PER_STEP, SKIP_STEPS
from benchmarks.helpers.machine import default_machine, load_average

__all__ = ["main"]

_METHOD_NOTES = [
    "Decisions: every round runs every subject once, in a seeded order shuffled identically on every rank, with fresh"
    " random per-rank metric values; an untimed barrier lines the ranks up before each call; the timed region is the"
    " call alone (perf_counter_ns on rank 0). Warm-up rounds are not kept.",
    "checkpoint/stock is ModelCheckpoint.check_monitor_top_k on a real DDPStrategy, in a full top-3 state so it"
    " compares and calls reduce_boolean_decision; checkpoint/<policy> is"
    " lightning_ext._decisions.checkpoint.decide_top_k on the"
    " same state. early_stopping/stock is EarlyStopping._run_early_stopping_check; early_stopping/<policy> is"
    " lightning_ext._decisions.early_stopping.run_early_stopping_check. Stock subjects run with lightning-ext's runtime"
    " seams taken"
    " out.",
    "Collectives are counted with benchmarks.helpers.collectives.count_collectives() (torch.distributed calls made from"
    f" Python; DDP's gradient buckets are not counted) over {COUNT_ROUNDS} untimed decisions per subject, and over"
    " the timed windows of one untimed fit per training configuration.",
    "Training step: 2 CPU ranks, a small MLP, CSVLogger, log_every_n_steps=1, one synced and one un-synced metric."
    " A step is timed from one on_train_batch_start to the next (forward, backward with DDP's all-reduce, optimizer,"
    f" batch-end hooks, the logger connector's log_metrics with the per-rank row, the next batch's fetch); the first"
    f" {SKIP_STEPS} steps of each fit are dropped. Stock (DDPStrategy, seams taken out), per-rank metrics"
    " (PolicyDDPStrategy(per_rank_metrics=True, hang_checks=False)), the default hang checks (PolicyDDPStrategy())"
    " and the debug checks (hang_checks='debug') run back to back in each repeat, in a new seeded random order every"
    " repeat, each after gc.collect() and os.sync(); each is compared with the stock fit of its repeat; median of"
    " those ratios.",
    "Per-rank row cost: in each timed per-rank fit, after its last timed step, lightning-ext's per-rank row path runs"
    f" {ROW_LOOPS_PER_STEP} x --train-steps times on the fit's own objects (record_update for both logged values,"
    " loggers_for, the per-rank logger's log_metrics and save, flushing to the real file every 100 rows), without"
    " Lightning's own logging work; the figure is its time per row (CPU and wall), median over the fits with the"
    " lowest and highest. The per-step figure is the paired difference of the fits' median step CPU times.",
]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.comm", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4], metavar="W", help="default: 2 4")
    parser.add_argument("--decisions", type=int, help=f"timed decisions per subject and world size ({FULL.decisions})")
    parser.add_argument("--warmup", type=int, help=f"untimed warm-up rounds per world size ({FULL.warmup})")
    parser.add_argument("--train-steps", type=int, help=f"timed training steps per fit ({FULL.train_steps})")
    parser.add_argument("--repeats", type=int, help=f"timed fits per training configuration ({FULL.repeats})")
    parser.add_argument("--smoke", action="store_true", help="tiny counts for CI, unless given explicitly")
    parser.add_argument(
        "--training-configs",
        nargs="+",
        choices=CONFIGS,
        metavar="NAME",
        help="a trimmed run: only these training configurations and their baselines (default: all)",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="default: benchmarks/results")
    parser.add_argument("--machine", help="names the output files (default: the CUDA device, or cpu-<N>core-<arch>)")
    parser.add_argument("--seed", type=int, default=FULL.seed, help="default: 0")
    return parser


def _counts(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Counts:
    base = SMOKE if args.smoke else FULL
    chosen = {name: getattr(args, name) for name in ("decisions", "warmup", "train_steps", "repeats")}
    only = args.training_configs or []
    with_baselines = tuple(dict.fromkeys([*only, *(BASELINES.get(config, "stock") for config in only)]))
    counts = Counts(
        **{k: getattr(base, k) if v is None else v for k, v in chosen.items()},
        seed=args.seed,
        training_configs=with_baselines,
    )
    for name, minimum in (("decisions", 1), ("warmup", 0), ("train_steps", 1), ("repeats", 1)):
        if getattr(counts, name) < minimum:
            parser.error(f"--{name.replace('_', '-')} must be at least {minimum}")
    if any(w < 1 for w in args.world_sizes):
        parser.error("--world-sizes must all be at least 1")
    if args.machine is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", args.machine):
        parser.error("--machine must be a plain file name: letters, digits, '.', '_' and '-'")
    return counts


def _run_all(sessions: list[SessionSpec], counts: Counts, notes: list[str]) -> list[SessionResult] | None:
    """Every session in turn under one progress bar; ``None`` if a CPU session failed (its error is printed)."""
    results: list[SessionResult] = []
    with (
        tempfile.TemporaryDirectory(prefix="lightning-ext-bench-") as workdir,
        tqdm(total=sum(progress_units(s, counts) for s in sessions), unit="op", dynamic_ncols=True) as bar,
    ):
        for spec in sessions:
            bar.set_description(spec.label)
            start = bar.n
            try:
                result = run_session(
                    spec, counts, workdir=workdir, timeout_s=session_timeout_s(spec, counts), on_progress=bar.update
                )
            except SessionFailed as exc:
                tqdm.write(f"error: {exc}", file=sys.stderr)
                if spec.device == "cpu":
                    return None
                notes.append(f"{spec.label}: failed, see the printed error: {str(exc).splitlines()[0]}")
                continue
            finally:
                bar.update(max(0, start + progress_units(spec, counts) - bar.n))
            if result.skipped:
                tqdm.write(f"{spec.label}: skipped: {result.skipped}")
                notes.append(f"{spec.label}: skipped: {result.skipped}")
            results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the exit status (0, or 1 if a session failed)."""
    parser = _parser()
    args = parser.parse_args(argv)
    counts = _counts(parser, args)
    machine = args.machine or default_machine()
    load_before = load_average()
    sessions = plan_sessions(args.world_sizes)
    gpu, gpu_note = gpu_sessions()
    print(gpu_note)
    notes = [*_METHOD_NOTES, gpu_note]
    results = _run_all([*sessions, *gpu], counts, notes)
    if results is None:
        return 1
    for result in results:
        if result.training is not None:
            fits = "; ".join(f"{config}: {dict(n)}" for config, n in result.training.fit_collectives.items())
            notes.append(f"{result.spec.label}: collectives of a whole counted fit, set-up included: {fits}.")
    rows = build_rows(results)
    targets = check_targets(rows)
    counts_used = {**asdict(counts), "world_sizes": args.world_sizes, "smoke": args.smoke, "count_rounds": COUNT_ROUNDS}
    counts_used["skip_steps"] = SKIP_STEPS
    meta = metadata(machine=machine, counts=counts_used, notes=notes, load_before=load_before)
    args.out.mkdir(parents=True, exist_ok=True)
    paths = [args.out / f"{machine}.{suffix}" for suffix in ("json", "md", "png")]
    costs, syncs, records, stalls = row_costs(results), sync_costs(results), record_costs(results), stall_costs(results)
    write_json(paths[0], rows, targets, meta, costs, syncs, records, stalls)
    report = markdown(rows, targets, meta, costs, syncs, records, stalls)
    paths[1].write_text(report, encoding="utf-8")
    write_chart(paths[2], rows, title=f"lightning-ext communication overhead: {machine}")
    print(report.split("\n## Notes")[0])
    print("wrote " + ", ".join(str(path) for path in paths))
    return 1 if len(results) < len(sessions) + len(gpu) else 0


if __name__ == "__main__":
    sys.exit(main())
