"""Each command's own flags, typed: launch/cli.py makes one of these from argparse's namespace,
and nothing past it sees the namespace. A field's name is its flag's argparse `dest`."""
from __future__ import annotations

from dataclasses import dataclass

from launch.render.options import RenderOptions


@dataclass(frozen=True)
class UpFlags:
    workers: int | None             # the first N workers of the pool (None: all)
    verbose: bool
    start_timeout: float
    finish_timeout: float
    overrides: tuple[str, ...]      # the --set options, which the run records
    rehearse: bool = False          # every task a light stand-in (launch/run/rehearsal.py)


@dataclass(frozen=True)
class ScaleFlags:
    workers: int


@dataclass(frozen=True)
class NoFlags:
    """A command without flags of its own (`launch down`)."""


@dataclass(frozen=True)
class JsonFlags:
    """status, plan, check: print JSON instead of text."""
    json: bool


@dataclass(frozen=True)
class PlanFlags(JsonFlags):
    """plan: --json, --link RATE (Mbit/s each way) and --from-run RUN (its measured compute)."""
    link: float | None = None
    from_run: str | None = None


@dataclass(frozen=True)
class StatusFlags(JsonFlags):
    """status: --json, and --all (a row per task, however many)."""
    all: bool = False


@dataclass(frozen=True)
class LogsFlags:
    task: str | None                # job:index (None: every task)
    follow: bool
    attempt: int | None             # an earlier attempt's logs (None: the newest's)


@dataclass(frozen=True)
class PreemptFlags:
    task: str                       # job:index: the task that gets the notice


@dataclass(frozen=True)
class EvalFlags:
    checkpoint: str | None          # a checkpoint prefix (None: the newest in train_dir)
    verbose: bool = False           # show TensorFlow's C++ start-up messages too


@dataclass(frozen=True)
class OutputFlags:
    """report, compose: where to write (None: the command's default)."""
    output: str | None


@dataclass(frozen=True)
class RenderFlags:
    format: str                     # a name in launch/render/__init__.py RENDERERS
    output: str | None
    render: RenderOptions


@dataclass(frozen=True)
class ListFlags:
    dir: str | None         # None: the runs of the user's index, from anywhere
    json: bool


@dataclass(frozen=True)
class DownloadFlags:
    dest: str
    url: str | None
    md5: str | None
