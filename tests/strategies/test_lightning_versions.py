"""Lightning versions: what is verified, the warning outside that set, and the signature checks of the runtime seams.

The verified releases are 2.5.6 and 2.6.6 (CI runs the suite against both). On another Lightning the strategy warns
once; a private method that lightning-ext wraps or calls with another signature stops it with an error that names the
method, both signatures and the version. Each case runs as a fresh interpreter (a child forked from a parent that has
imported one Lightning package, ``lightning`` or ``pytorch_lightning``, but not lightning-ext), for each package: the
seams are installed once per process, and the version string is monkeypatched there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from subprocess import PIPE

import lightning
import pytest
import tomllib
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
VERIFIED = ("2.5.6", "2.6.6")  # this test's own copy: pyproject.toml, the series and the warning must all say so
Python = Callable[[str], subprocess.CompletedProcess[str]]


# A parent that imports Lightning and torch once, then forks a child per case: the child is a fresh interpreter as
# far as lightning_ext goes (never imported in the parent), without paying Lightning's import again (seconds).
_FORKER = """
import json, os, sys, tempfile, traceback
import {package}, torch  # noqa: F401
for line in sys.stdin:
    code = json.loads(line)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = os.fork()
        if child == 0:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            status = 0
            try:
                exec(compile(code, "<case>", "exec"), {"__name__": "__main__"})
            except BaseException:
                traceback.print_exc()
                status = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        _, status = os.waitpid(child, 0)
        out.seek(0)
        err.seek(0)
        result = [os.waitstatus_to_exitcode(status), out.read().decode(), err.read().decode()]
    print(json.dumps(result), flush=True)
"""


# each package's names: its import name, its strategies' package, how its messages name it, what pip installs
PACKAGES = {
    "lightning": {"package": "lightning", "pytorch": "lightning.pytorch", "called": "Lightning", "pip": "lightning"},
    "pytorch_lightning": {
        "package": "pytorch_lightning",
        "pytorch": "pytorch_lightning",
        "called": "pytorch_lightning",
        "pip": "pytorch-lightning",
    },
}


@pytest.fixture(scope="module", params=list(PACKAGES))
def package(request: pytest.FixtureRequest) -> dict[str, str]:
    return PACKAGES[request.param]


@pytest.fixture(scope="module")
def python(package: dict[str, str]) -> Iterator[Python]:
    """``python(code)`` runs ``code`` as a fresh interpreter would, on the installed package, seams allowed."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("LIGHTNING_EXT_")}
    env["PYTHONPATH"] = str(REPO)
    command = [sys.executable, "-c", _FORKER.replace("{package}", package["package"])]
    with subprocess.Popen(command, stdin=PIPE, stdout=PIPE, stderr=PIPE, text=True, cwd=REPO, env=env) as forker:

        def run(code: str) -> subprocess.CompletedProcess[str]:
            assert forker.stdin is not None and forker.stdout is not None and forker.stderr is not None
            forker.stdin.write(json.dumps(code) + "\n")
            forker.stdin.flush()
            if not (line := forker.stdout.readline()):
                raise RuntimeError(f"the forking parent died: {forker.stderr.read()[-3000:]}")
            returncode, stdout, stderr = json.loads(line)
            return subprocess.CompletedProcess(command, returncode, stdout, stderr)

        yield run
        forker.stdin.close()  # type: ignore[union-attr]


_WARNINGS = """
import json, warnings
import {package} as lightning
lightning.__version__ = {version!r}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import lightning_ext
    from lightning_ext.{package} import PolicyDDPStrategy
    PolicyDDPStrategy()
    PolicyDDPStrategy(checkpoint_policy="mean")
print("WARNINGS " + json.dumps([str(w.message) for w in caught if "lightning-ext" in str(w.message)]))
"""


@pytest.mark.parametrize("version", ["2.5.5", "2.6.0", "2.7.0"])
def test_an_unverified_lightning_gets_one_warning_naming_the_verified_releases(
    version: str, python: Python, package: dict[str, str]
) -> None:
    run = python(_WARNINGS.format(version=version, package=package["package"]))
    assert run.returncode == 0, run.stderr[-3000:]
    (line,) = [line for line in run.stdout.splitlines() if line.startswith("WARNINGS ")]
    (message,) = json.loads(line[len("WARNINGS ") :])
    assert "verified with Lightning 2.5.6 and 2.6.6" in message
    assert f"the installed {package['called']} is {version}" in message
    assert f"`pip install '{package['pip']}==2.6.6'`" in message


def test_a_verified_lightning_gets_no_warning(python: Python, package: dict[str, str]) -> None:
    assert lightning.__version__ in VERIFIED
    run = python(_WARNINGS.format(version=lightning.__version__, package=package["package"]))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "WARNINGS []" in run.stdout.splitlines()


_SIGNATURE = """
import {package} as lightning
from {pytorch}.callbacks import EarlyStopping, ModelCheckpoint
from {pytorch}.loops.evaluation_loop import _EvaluationLoop
from lightning_ext.{package} import PolicyDDPStrategy

lightning.__version__ = "2.7.0"
owner = {owner}
original = owner.__dict__[{name!r}]
{replacement}
try:
    PolicyDDPStrategy()
except RuntimeError as error:
    print("ERROR " + str(error))
wrapped = [
    name for name, function in vars(ModelCheckpoint).items() if getattr(function, "__lightning_ext_seam__", False)
]
print("WRAPPED " + ",".join(wrapped))
setattr(owner, {name!r}, original)
PolicyDDPStrategy()  # the stock method back: the seams install
print("INSTALLED " + str(getattr(ModelCheckpoint._save_topk_checkpoint, "__lightning_ext_seam__", False)))
"""


@pytest.mark.parametrize(
    ("owner", "name", "replacement", "expected", "found"),
    [
        (
            "ModelCheckpoint",
            "_save_topk_checkpoint",
            "ModelCheckpoint._save_topk_checkpoint = lambda self, trainer, candidates, force=False: None",
            "(self, trainer, monitor_candidates)",
            "(self, trainer, candidates, force)",
        ),
        (  # a property's getter
            "_EvaluationLoop",
            "max_batches",
            "_EvaluationLoop.max_batches = property(lambda self, stage=None: [])",
            "(self)",
            "(self, stage)",
        ),
        (  # called by the decisions, not wrapped
            "EarlyStopping",
            "_evaluate_stopping_criteria",
            "EarlyStopping._evaluate_stopping_criteria = lambda self, current, trainer: (False, None)",
            "(self, current)",
            "(self, current, trainer)",
        ),
        (  # gone
            "EarlyStopping",
            "_run_early_stopping_check",
            "del EarlyStopping._run_early_stopping_check",
            "(self, trainer)",
            "no such method",
        ),
    ],
)
def test_a_changed_lightning_method_stops_the_strategy_before_anything_is_wrapped(
    owner: str, name: str, replacement: str, expected: str, found: str, python: Python, package: dict[str, str]
) -> None:
    names = {"package": package["package"], "pytorch": package["pytorch"]}
    run = python(_SIGNATURE.format(owner=owner, name=name, replacement=replacement, **names))
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    (error,) = [line[len("ERROR ") :] for line in lines if line.startswith("ERROR ")]
    assert error.startswith(f"lightning-ext cannot use {package['pytorch']}.")  # the package's own class
    assert f"{owner}.{name} of {package['called']} 2.7.0" in error
    assert f"`pip install '{package['pip']}==2.6.6'`" in error
    assert f"expects the parameters {expected}, found {found}" in error
    assert "verified with Lightning 2.5.6 and 2.6.6" in error
    assert "WRAPPED " in lines  # nothing was wrapped before the error
    assert "INSTALLED True" in lines


def test_trainer_run_accepts_either_verified_signature(python: Python, package: dict[str, str]) -> None:
    """``Trainer._run`` gained ``weights_only`` in 2.6: both forms are accepted, a third is not."""
    code = f"""
from {package["pytorch"]} import Trainer
from lightning_ext.{package["package"]} import PolicyDDPStrategy
for params in ("self, model, ckpt_path=None", "self, model, ckpt_path=None, weights_only=None", "self, model"):
    namespace = {{}}
    exec(f"def _run({{params}}): pass", namespace)
    Trainer._run = namespace["_run"]
    try:
        PolicyDDPStrategy()
        print("OK", getattr(Trainer._run, "__lightning_ext_seam__", False))
    except RuntimeError as error:
        print("ERROR", "Trainer._run" in str(error))
"""
    run = python(code)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines() == ["OK True", "OK True", "ERROR True"]


def test_pyproject_and_the_series_cover_exactly_the_verified_releases() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for name in ("lightning", "pytorch-lightning"):  # the standalone package: the same releases
        (spec,) = [Requirement(dep) for dep in project["dependencies"] if Requirement(dep).name == name]
        assert all(spec.specifier.contains(version) for version in VERIFIED)
        assert not spec.specifier.contains("2.4.0") and not spec.specifier.contains("2.7.0")
    series = sorted(path.name for path in (REPO / "patches").glob("lightning-*") if path.is_dir())
    assert series == [f"lightning-{version}" for version in VERIFIED]
    numbered = {
        version: [path.name[:4] for path in sorted((REPO / "patches" / f"lightning-{version}").glob("*.patch"))]
        for version in VERIFIED
    }
    for version, numbers in numbered.items():  # one series, numbered from 0001 without a gap, for every release
        assert numbers == [f"{n:04d}" for n in range(1, len(numbers) + 1)] == numbered[VERIFIED[0]], version
    assert len(numbered[VERIFIED[0]]) == 7  # "the same seven patches" (patches/README.md)
