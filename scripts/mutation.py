"""Mutation testing of the pure rule modules with cosmic-ray (``make mutation``; docs/testing.md).

Each module is mutated in a copy of the repository of its own (cosmic-ray writes each mutant over the module's file),
one mutant at a time, and its fast tests run against every mutant: a mutant is killed when they fail. Prints each
module's kill ratio and every survivor; exits 1 when a module's ratio is under ``--floor`` percent.

Usage: ``.venv/bin/python scripts/mutation.py [--jobs N] [--seed N] [MODULE ...]`` (default: every module below).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import difflib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from multiprocessing.connection import Client
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "build" / "mutation"
SERVER = Path(__file__).resolve().parent / "mutation_server.py"  # a warm pytest: a fork per mutant
# the Lightning-bound test of test_messages.py is about where a call comes from (sites.py), and costs an import of
# Lightning per mutant
CHECKS = [
    "tests/checks/test_verdicts.py",
    "tests/checks/test_messages.py",
    "tests/checks/test_culprit.py",
    "tests/checks/test_wording.py",
    "--deselect=tests/checks/test_messages.py::test_a_call_that_lightning_makes_with_no_user_frame_on_the_stack_is_lightnings_own",
]
# each module and the fast tests run against its mutants (its doctests are added): pure functions, one process
MODULES: dict[str, list[str]] = {
    "lightning_ext/_checks/culprit.py": CHECKS,
    "lightning_ext/_checks/verdict.py": CHECKS,
    "lightning_ext/_checks/messages.py": CHECKS,
    "lightning_ext/_watch/rank_text.py": [*CHECKS, "tests/stall/test_stall_rules.py"],
    "lightning_ext/policies.py": ["tests/decisions/test_policies.py", "tests/decisions/test_reasons.py"],
    "lightning_ext/_summaries/stragglers.py": [
        "tests/summaries/test_stragglers.py",
        "tests/telemetry/test_straggler_watch.py::test_rank_0_judges_without_importing_pandas",
    ],
    "lightning_ext/_decisions/rows.py": ["tests/decisions/test_rows.py", "tests/decisions/test_reasons.py"],
}
# Left out, for time: an arithmetic operator replaced by a bitwise, shift or power operator (6 of the 11 replacements
# cosmic-ray makes of each). The 5 arithmetic replacements (+ - * / // %) stay, and every other operator.
EXCLUDED = [r"core/ReplaceBinaryOperator_\w+_(BitOr|BitAnd|BitXor|LShift|RShift|Pow)$"]
FLOOR = 90.0  # percent: the least kill ratio of each module
TIMEOUT = 300.0  # seconds for cosmic-ray's test command (the server's own limit is shorter: mutation_server.py)
COPIED = ("lightning_ext", "tests", "benchmarks", "pyproject.toml")
ANNOTATION = "in a type annotation"  # a skipped mutant's note: equivalent by construction (_skip_annotations)
WORK = "mutation"  # in the copy: the original module, the pytest command, which tests run each line


@dataclass
class Survivor:
    """A mutant the tests did not kill: its line, cosmic-ray's operator, the lines it changed (``-`` then ``+``)."""

    line: int
    operator: str
    diff: list[str]


@dataclass
class Report:
    """One module's mutation run: its mutants (the excluded operators' left out), those killed, the survivors."""

    module: str
    mutants: int
    killed: int
    annotations: int  # mutants in type annotations, left out: equivalent by construction
    seconds: float
    survivors: list[Survivor]

    @property
    def ratio(self) -> float:
        """The kill ratio, in percent."""
        return 100.0 * self.killed / self.mutants if self.mutants else 100.0


def _pytest(module: str, seed: int) -> list[str]:
    """The module's fast tests and its doctests, under pytest: stop at the first failure; one seed for every run."""
    return [
        *(sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"),
        *("-o", "addopts=--doctest-modules", f"--hypothesis-seed={seed}", *MODULES[module], module),
    ]


def _config(copy: Path, module: str) -> Path:
    command = [sys.executable, str(Path(__file__).resolve()), "--run-tests", module]
    lines = [
        "[cosmic-ray]",
        f"module-path = {json.dumps(str(copy / module))}",
        f"timeout = {TIMEOUT}",
        "excluded-modules = []",
        f"test-command = {json.dumps(shlex.join(command))}",
        "[cosmic-ray.distributor]",
        'name = "local"',
        "[cosmic-ray.filters.operators-filter]",
        f"exclude-operators = {json.dumps(EXCLUDED)}",
    ]
    path = copy / "cosmic-ray.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _env(copy: Path, **more: str) -> dict[str, str]:
    # no bytecode: a mutant of the same size written within the same second must not be read from a stale .pyc
    return {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(copy), "HYPOTHESIS_PROFILE": "ci", **more}


def _run(command: list[str], copy: Path, **env: str) -> None:
    done = subprocess.run(command, cwd=copy, env=_env(copy, **env), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")


def mutate(module: str, seed: int) -> Report:
    """Every mutant of ``module`` against its tests, in a copy of the repository: the figures and the survivors."""
    started = time.monotonic()
    bin_dir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory(prefix="mutation-") as temporary:
        copy = Path(temporary)
        for name in COPIED:
            source = REPO / name
            if source.is_dir():
                shutil.copytree(source, copy / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(source, copy / name)
        work = copy / WORK
        work.mkdir()
        shutil.copy2(copy / module, work / "original.py")
        (work / "pytest.json").write_text(json.dumps(_pytest(module, seed)))
        # which tests run each line of the module, once: each mutant then runs only the tests that reach its line
        traced = [*_pytest(module, seed), "-p", "mutation_trace"]
        trace_env = {"MUTATION_TRACE_MODULE": str(copy / module), "MUTATION_TRACE_OUT": str(work / "lines.json")}
        _run(traced, copy, PYTHONPATH=f"{copy}{os.pathsep}{Path(__file__).parent}", **trace_env)
        config, session = _config(copy, module), copy / "session.sqlite"
        _run([str(bin_dir / "cosmic-ray"), "init", str(config), str(session)], copy)
        _run([str(bin_dir / "cr-filter-operators"), str(session), str(config)], copy)
        _skip_annotations(session, (copy / module).read_text())
        address = copy / WORK / "server.sock"
        server = subprocess.Popen([sys.executable, str(SERVER), str(address)], cwd=copy, env=_env(copy))
        try:
            while not address.exists():
                if server.poll() is not None:
                    raise RuntimeError(f"the test runner for {module} ended with {server.returncode}")
                time.sleep(0.1)
            _run([str(bin_dir / "cosmic-ray"), "baseline", str(config)], copy)  # the tests pass on the module as is
            _run([str(bin_dir / "cosmic-ray"), "exec", str(config), str(session)], copy)
        finally:
            with contextlib.suppress(OSError), Client(str(address), family="AF_UNIX") as client:
                client.send(None)
            server.wait(30)
        return _figures(module, session, time.monotonic() - started)


def _skip_annotations(session: Path, source: str) -> None:
    """Skip the mutants inside type annotations: under ``from __future__ import annotations`` they are strings that
    nothing evaluates, so equivalent by construction (``str | None`` made ``str - None``)."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    tree = ast.parse(source)
    if not any(isinstance(node, ast.ImportFrom) and node.module == "__future__" for node in tree.body):
        return  # annotations are evaluated: their mutants run like any other
    spans = []
    for node in ast.walk(tree):
        found: list[ast.expr | None] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append(node.returns)
        elif isinstance(node, ast.arg | ast.AnnAssign):
            found.append(node.annotation)
        spans += [
            ((a.lineno, a.col_offset), (a.end_lineno or a.lineno, a.end_col_offset or 0))
            for a in found
            if a is not None
        ]
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item in db.pending_work_items:
            mutation = item.mutations[0]
            start, end = tuple(mutation.start_pos), tuple(mutation.end_pos)
            if any(first <= start and end <= last for first, last in spans):
                db.set_result(item.job_id, WorkResult(output=ANNOTATION, worker_outcome=WorkerOutcome.SKIPPED))


def run_tests(module: str) -> int:
    """cosmic-ray's test command for one mutant, in the module's copy (the working directory): the tests that run
    the changed statement; every test where it runs at import (a module-level constant, a default, a decorator) or
    where nothing changed (the baseline). No test runs it: exit 0, the mutant survives (no test can kill it)."""
    copy = Path.cwd()
    shutil.rmtree(copy / ".hypothesis", ignore_errors=True)  # no example saved by another mutant's run: reproducible
    original = (copy / WORK / "original.py").read_text()
    command: list[str] = json.loads((copy / WORK / "pytest.json").read_text())
    changed = _changed_lines(original, (copy / module).read_text())
    tests = _tests_reaching(original, changed, json.loads((copy / WORK / "lines.json").read_text()))
    if tests is not None and not tests:
        return 0
    arguments = command[3:]  # pytest's own, after `python -m pytest`
    if tests is not None:
        arguments = [arg for arg in arguments if arg.startswith("-")] + tests
    with Client(str(copy / WORK / "server.sock"), family="AF_UNIX") as client:
        client.send(arguments)
        code: int = client.recv()
    return code


def _changed_lines(original: str, mutated: str) -> set[int]:
    matcher = difflib.SequenceMatcher(a=original.splitlines(), b=mutated.splitlines(), autojunk=False)
    changed: set[int] = set()
    for tag, first, last, _, _ in matcher.get_opcodes():
        if tag != "equal":
            changed.update(range(first + 1, max(last, first + 1) + 1))
    return changed


def _tests_reaching(original: str, changed: set[int], lines: dict[str, list[str]]) -> list[str] | None:
    """The tests that ran a changed statement of a function body; ``None``: every test (import time, or no change)."""
    if not changed:
        return None
    tree = ast.parse(original)
    bodies = [
        (node.body[0].lineno, node.end_lineno or node.body[0].lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    statements = [node for node in ast.walk(tree) if isinstance(node, ast.stmt)]
    tests: set[str] = set()
    for line in changed:
        if not any(first <= line <= last for first, last in bodies):
            return None  # runs at import: every test depends on it
        around = [node for node in statements if node.lineno <= line <= (node.end_lineno or node.lineno)]
        inner = min(around, key=lambda node: (node.end_lineno or node.lineno) - node.lineno)
        for number in range(inner.lineno, (inner.end_lineno or inner.lineno) + 1):
            tests.update(lines.get(str(number), ()))
    return sorted(tests)


def _figures(module: str, session: Path, seconds: float) -> Report:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    killed, annotations, survivors = 0, 0, list[Survivor]()
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item, result in db.completed_work_items:
            if result.worker_outcome == WorkerOutcome.SKIPPED:
                annotations += result.output == ANNOTATION
                continue
            if result.test_outcome == TestOutcome.SURVIVED:
                mutation = item.mutations[0]
                changed = [
                    line for line in (result.diff or "").splitlines() if line[:1] in "+-" and line[:3] not in "+++---"
                ]
                survivors.append(Survivor(mutation.start_pos[0], mutation.operator_name, changed))
            else:
                killed += 1
    survivors.sort(key=lambda survivor: (survivor.line, survivor.operator))
    return Report(module, killed + len(survivors), killed, annotations, seconds, survivors)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", default=list(MODULES), help="modules to mutate (default: all)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="modules mutated at once")
    parser.add_argument("--seed", type=int, default=0, help="the properties' Hypothesis seed (fixed: same figures)")
    parser.add_argument("--floor", type=float, default=FLOOR, help="least kill ratio per module, in percent")
    parser.add_argument("--run-tests", metavar="MODULE", help=argparse.SUPPRESS)  # cosmic-ray's test command
    args = parser.parse_args(argv)
    if args.run_tests:
        return run_tests(args.run_tests)
    unknown = [module for module in args.modules if module not in MODULES]
    if unknown:
        parser.error(f"not a module of the mutation run: {unknown}; choose from {list(MODULES)}")
    started = time.monotonic()
    OUT.mkdir(parents=True, exist_ok=True)
    low, reports = [], []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        # the largest first, each printed as it ends
        ordered = sorted(args.modules, key=lambda module: -(REPO / module).stat().st_size)
        futures = {pool.submit(mutate, module, args.seed): module for module in ordered}
        for future in as_completed(futures):
            try:
                report = future.result()
            except Exception as error:  # a module that could not be run: said, and the others go on
                print(f"{futures[future]}: not run: {error}", flush=True)
                low.append(futures[future])
                continue
            reports.append(report)
            print(
                f"{report.module}: {report.killed}/{report.mutants} mutants killed, {report.ratio:.1f}%"
                f" ({report.annotations} in type annotations left out; {report.seconds / 60:.0f} min)",
                flush=True,
            )
            for survivor in report.survivors:
                print(f"  survived: line {survivor.line} {survivor.operator}: {' | '.join(survivor.diff)}", flush=True)
            if report.ratio < args.floor:
                low.append(report.module)
            (OUT / (report.module.replace("/", ".") + ".json")).write_text(
                json.dumps({**asdict(report), "ratio": report.ratio}, indent=1)
            )
    print(f"mutation: {len(reports)} module(s) in {(time.monotonic() - started) / 60:.0f} min; reports in {OUT}")
    if low:
        print(f"mutation: under {args.floor:.0f}% killed: {', '.join(map(str, low))}")
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())
