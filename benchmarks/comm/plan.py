"""What to measure: the counts, the sessions (one process group each), their progress units and deadlines."""

from dataclasses import dataclass

from benchmarks.comm.decisions import COUNT_ROUNDS, decision_subjects
from benchmarks.comm.training import CONFIGS, SKIP_STEPS

__all__ = [
    "COLLECTIVE_TIMEOUT_S",
    "FULL",
    "SMOKE",
    "TRAIN_WORLD_SIZE",
    "Counts",
    "SessionSpec",
    "plan_sessions",
    "progress_units",
    "session_timeout_s",
]

COLLECTIVE_TIMEOUT_S = 120.0
TRAIN_WORLD_SIZE = 2


@dataclass(frozen=True)
class Counts:
    """How much to measure.

    Attributes:
        decisions: timed decisions per subject.
        warmup: untimed warm-up rounds (every subject once per round).
        train_steps: timed steps per training fit.
        repeats: timed training fits per configuration.
        seed: the seed of every random choice.
        training_configs: the training configurations to run (a trimmed run), their baselines included; all if empty.

    """

    decisions: int
    warmup: int
    train_steps: int
    repeats: int
    seed: int
    training_configs: tuple[str, ...] = ()

    @property
    def configs(self) -> tuple[str, ...]:
        """The training configurations this run measures, in :data:`~benchmarks.comm.training.CONFIGS` order."""
        return tuple(config for config in CONFIGS if config in (self.training_configs or CONFIGS))


@dataclass(frozen=True)
class SessionSpec:
    """One process group and what to measure in it.

    Attributes:
        backend: ``"gloo"`` or ``"nccl"``.
        device: ``"cpu"`` or ``"cuda"`` (every rank uses ``cuda:0``).
        world_size: the number of ranks.
        decisions: measure the decision subjects.
        training: measure the training step (CPU ranks).

    """

    backend: str
    device: str
    world_size: int
    decisions: bool = True
    training: bool = False

    @property
    def label(self) -> str:
        """``gloo/cpu W=2``."""
        return f"{self.backend}/{self.device} W={self.world_size}"


FULL = Counts(decisions=2000, warmup=200, train_steps=200, repeats=20, seed=0)
SMOKE = Counts(decisions=20, warmup=3, train_steps=6, repeats=1, seed=0)


def plan_sessions(world_sizes: list[int]) -> list[SessionSpec]:
    """One gloo CPU session per world size (decisions); the training step runs in the world-size-2 session."""
    unique = list(dict.fromkeys(world_sizes))
    sessions = [SessionSpec("gloo", "cpu", w, decisions=True, training=w == TRAIN_WORLD_SIZE) for w in unique]
    if TRAIN_WORLD_SIZE not in unique:
        sessions.append(SessionSpec("gloo", "cpu", TRAIN_WORLD_SIZE, decisions=False, training=True))
    return sessions


def progress_units(spec: SessionSpec, counts: Counts) -> int:
    """Progress units of a session: one per decision made, one per training step run."""
    units = 0
    if spec.decisions:
        units += (counts.warmup + COUNT_ROUNDS + counts.decisions) * len(decision_subjects())
    if spec.training:
        units += len(counts.configs) * (1 + counts.repeats) * (SKIP_STEPS + counts.train_steps + 1)
    return units


def session_timeout_s(spec: SessionSpec, counts: Counts) -> float:
    """A generous deadline: start-up, plus far more than a decision or step should ever take on a busy machine."""
    seconds = 2 * COLLECTIVE_TIMEOUT_S
    if spec.decisions:
        seconds += (counts.warmup + COUNT_ROUNDS + counts.decisions) * len(decision_subjects()) * 0.02 * spec.world_size
    if spec.training:
        seconds += len(counts.configs) * (1 + counts.repeats) * (60 + 0.5 * (SKIP_STEPS + counts.train_steps + 1))
    return seconds
