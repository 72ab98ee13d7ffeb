"""The run directory: the single source of truth for a run.

    runs/<run-id>/
      manifest.json        config, versions, devices, created
      events.jsonl         append-only; every LLM call, candidate, evaluation, world-model call
      solutions/<id>.json  code by content hash (failures included)
      world_model/         the world model's record (`TreeRecord`): deltas.jsonl, one line per tree version,
                           and v<version>.json full checkpoints now and then; a run written before
                           the deltas has a full v<version>.json for every version (and latest.json)
      llm_cache/           replayable LLM responses (content-hash keyed)
      best.json            the best passing solution so far, rewritten as it improves
      best/                the same solution's source files, as plain files
      lock                 held by the one process that writes the run (pid, host, since)

Events (`ksearch_ray.events`: typed, one schema) are written by one process (the driver), one JSON
line each, flushed to the OS at once (a killed driver loses nothing) and fsynced in groups: at most
FSYNC_EVERY_S after it was written, by a timer, and on close (group commit: at width 1,024 one fsync per
event was half the driver's time). What an OS crash or a power cut can take is the last FSYNC_EVERY_S of
events, whose lines are then missing or cut: a cut line is a torn tail (below). A last line cut short (SIGKILL, a full disk) is moved aside to
events.torn-<line>.jsonl when the writer reopens the log, and left out in memory by readers
(`read_events`). Resume folds the events. One writer at a time: opening a run for writing takes an exclusive lock on `lock` (flock, released
by the kernel when the process dies, so a killed run never stays locked), and a second writer is
told who holds it. Readers (`show`, `report`) take no lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import platform
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ksearch_ray.events import SCHEMA, Event, EventError, dump_event, gc_paused, parse_event
from ksearch_ray.models import Solution
from ksearch_ray.text import Redactor

FSYNC_EVERY_S = 0.5
"""The event log's loss window on an OS crash: events are fsynced in groups at most this long after their write."""


class RunDirError(Exception):
    """A run directory that cannot be used; the message is one line."""


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """A write to the run directory that the file system refuses (read-only, full, no permission) becomes a
    RunDirError in one line that says what to do; the run stays as it was written up to there."""
    try:
        yield
    except OSError as exc:
        if isinstance(exc, BlockingIOError):
            raise
        why = {errno.EROFS: "the file system is read-only: copy the run directory somewhere writable (cp -r) and "
                            "resume the copy, or read it with `ksearch show`",
               errno.ENOSPC: "the disk is full: free space, then `ksearch resume` the run",
               errno.EDQUOT: "the disk quota is spent: free space, then `ksearch resume` the run",
               errno.EACCES: "no permission to write there: resume it as its owner, or resume a copy (cp -r)",
               errno.EPERM: "no permission to write there: resume it as its owner, or resume a copy (cp -r)"}
        hint = why.get(exc.errno or 0, "the run directory must be writable to run or resume")
        raise RunDirError(f"cannot write {exc.filename or path}: {exc.strerror or exc}; {hint}") from None


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with writing(path):
        tmp.write_text(text)
        os.replace(tmp, path)


def versions() -> dict[str, str]:
    """The versions a run was made with (read from the installed metadata: nothing is imported)."""
    from importlib.metadata import PackageNotFoundError, version

    import ksearch_ray

    out = {"ksearch_ray": ksearch_ray.__version__, "python": platform.python_version()}
    for package in ("torch", "triton", "ray", "litellm"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "not installed"
    return out


def read_manifest(root: Path) -> dict[str, Any]:
    """The manifest of a run directory; RunDirError with one line if there is none or it is unreadable."""
    path = root / "manifest.json"
    if root.exists() and not root.is_dir():
        raise RunDirError(f"{root} is a file, not a run directory")
    if not path.is_file():
        raise RunDirError(f"{root} is not a run directory (no manifest.json)")
    try:
        manifest = json.loads(path.read_text())
    except ValueError:
        raise RunDirError(f"{path}: not valid JSON") from None
    if not isinstance(manifest, dict):
        raise RunDirError(f"{path}: expected a JSON object")
    return manifest


class RunStore:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.events_path = self.root / "events.jsonl"
        self.solutions_dir = self.root / "solutions"
        self.snapshots_dir = self.root / "world_model"
        self.cache_dir = self.root / "llm_cache"
        self._seq = 0
        self._fh: Any = None
        self._dirty = False  # written and flushed, not yet fsynced
        self._sync_lock = threading.Lock()  # the timer's fsync and close never meet on one handle
        self._syncer: threading.Thread | None = None
        self._stop_sync = threading.Event()
        self._lock_fh: Any = None
        self.redact = Redactor.from_environment()
        """The event log's guard: no secret value of this process is written (the run adds its API key's name)."""
        self.torn: str | None = None
        """One line on the torn tail the last `read_events` left out (and, repairing, moved aside); None: none."""
        self.repaired: str | None = None
        """What opening the log for writing repaired (a torn tail moved aside), in one line; None: nothing."""

    # --- creation / opening -----------------------------------------------------------------

    @classmethod
    def create(cls, root: Path, manifest: dict[str, Any]) -> RunStore:
        root = Path(root).resolve()
        if root.exists() and not root.is_dir():
            raise RunDirError(f"{root} exists and is not a directory; give --run-dir a new or empty directory")
        if (root / "manifest.json").exists():
            raise RunDirError(f"{root} already holds a run; use `ksearch resume {root}`")
        manifest = {"schema": SCHEMA, **manifest}
        with writing(root):
            for sub in ("solutions", "world_model", "llm_cache"):
                (root / sub).mkdir(parents=True, exist_ok=True)
        store = cls(root)
        store._lock()
        atomic_write(root / "manifest.json", json.dumps(manifest, indent=2, default=str))
        store._open()
        return store

    @classmethod
    def open(cls, root: Path) -> RunStore:
        root = Path(root).resolve()
        if not (root / "manifest.json").is_file():
            raise RunDirError(f"{root} is not a run directory (no manifest.json)")
        store = cls(root)
        store.check_schema()
        store._lock()
        store._open()
        return store

    def check_schema(self) -> None:
        """A run written by another version of the event schema is refused in one line."""
        schema = read_manifest(self.root).get("schema", 1)
        if schema != SCHEMA:
            raise RunDirError(f"{self.root} was written with event schema {schema}; this ksearch-ray reads schema "
                              f"{SCHEMA}: use the ksearch-ray version that made it")

    def _lock(self) -> None:
        """Become the run's only writer, or say who is."""
        with writing(self.root / "lock"):
            fh = open(self.root / "lock", "a+", encoding="utf-8")  # noqa: SIM115  (held for the run)
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip()
            fh.close()
            try:
                info = json.loads(holder)
                who = (f"process {info['pid']} on {info['host']} since "
                       f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(info['since']))}")
            except (ValueError, KeyError, TypeError):
                who = "another process"
            raise RunDirError(f"{self.root} is in use by {who}; wait for it to end or stop it first") from None
        try:
            with writing(self.root / "lock"):
                fh.seek(0)
                fh.truncate()
                fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}))
                fh.flush()
        except RunDirError:
            fh.close()
            raise
        self._lock_fh = fh

    def manifest(self) -> dict[str, Any]:
        return read_manifest(self.root)

    def _open(self) -> None:
        with writing(self.events_path):
            events = self.read_events(repair=True)
            self._fh = open(self.events_path, "a", encoding="utf-8")  # noqa: SIM115  (held for the run)
        self.repaired = self.torn
        self._seq = events[-1].seq if events else 0

    def _sync_now(self) -> None:
        with self._sync_lock:
            if self._fh is not None and self._dirty:
                self._dirty = False
                os.fsync(self._fh.fileno())

    def _sync_loop(self) -> None:
        while not self._stop_sync.wait(FSYNC_EVERY_S):
            with contextlib.suppress(OSError):  # a full disk is said at the next write, in the writer's thread
                self._sync_now()

    def close(self) -> None:
        self._stop_sync.set()
        if self._syncer is not None:
            self._syncer.join()
            self._syncer = None
        if self._fh is not None:
            with contextlib.suppress(OSError):  # a full disk already said so, at the write that failed
                self._sync_now()
                self._fh.close()
            self._fh = None
        if self._lock_fh is not None:
            with contextlib.suppress(OSError):
                self._lock_fh.truncate(0)
            self._lock_fh.close()  # releases the flock
            self._lock_fh = None

    # --- events -------------------------------------------------------------------------------

    def append(self, event: Event) -> Event:
        """Number, stamp and write one event; it is in the OS's hands when this returns (a killed process loses
        nothing) and on disk within FSYNC_EVERY_S (group commit)."""
        self._seq += 1
        event.seq, event.t = self._seq, time.time()
        with writing(self.events_path):
            self._fh.write(self.redact.json_safe(dump_event(event)) + "\n")
            self._fh.flush()
            self._dirty = True
        if self._syncer is None:
            self._stop_sync.clear()
            self._syncer = threading.Thread(target=self._sync_loop, name="ksearch-fsync", daemon=True)
            self._syncer.start()
        return event

    def read_events(self, *, repair: bool = False) -> list[Event]:
        """Every whole event of the log. A torn tail (a last line that is not an event: a write cut short by a
        kill or a full disk) is left out and `torn` says so in one line; with `repair` (the writer, on open)
        its bytes are also moved aside to events.torn-<line>.jsonl and the log cut before it, while readers
        (`show`, `report`) repair only in memory: they never write, and may be reading a live run. A last line
        that lacks only its newline is a whole event: kept (and, with `repair`, completed). A line that is not
        an event anywhere else is refused in one line that names it and the way out."""
        self.torn = None
        if not self.events_path.exists():
            return []
        raw = self.events_path.read_bytes()
        lines = raw.splitlines(keepends=True)
        events: list[Event] = []
        good_bytes = 0
        with gc_paused():  # events.gc_paused
            for number, line in enumerate(lines, start=1):
                try:
                    events.append(parse_event(line))
                except (EventError, ValueError) as exc:
                    if number == len(lines):
                        self._torn_tail(number, line, good_bytes, repair)
                        break
                    raise RunDirError(
                        f"{self.events_path}: line {number} of {len(lines)} is not an event of this version ({exc}) and "
                        f"is not the last one, so it is no torn write: repair or remove that line by hand, or keep the run "
                        f"up to it with `head -n {number - 1} {self.events_path} > events.cut && mv events.cut "
                        f"{self.events_path}` (keep a copy first)") from None
                good_bytes += len(line)
        if repair and raw and not raw.endswith(b"\n") and self.torn is None:
            with open(self.events_path, "ab") as f:  # a whole last event that only lost its newline
                f.write(b"\n")
        return events

    def _torn_tail(self, number: int, line: bytes, good_bytes: int, repair: bool) -> None:
        cut = "without its newline" if not line.endswith(b"\n") else "ending in a newline"
        if not repair:
            self.torn = (f"{self.events_path}: line {number} (the last, {len(line)} bytes, {cut}) is not a whole event "
                         "(a write cut short, or one in progress): read without it; `ksearch resume` moves it aside")
            return
        aside = self.root / f"events.torn-{number}.jsonl"
        again = 1
        while aside.exists():  # torn at the same line before: keep both
            again += 1
            aside = self.root / f"events.torn-{number}-{again}.jsonl"
        aside.write_bytes(line)
        with open(self.events_path, "r+b") as f:
            f.truncate(good_bytes)
            f.flush()
            os.fsync(f.fileno())
        self.torn = (f"{self.events_path}: line {number} (the last, {len(line)} bytes, {cut}) was not a whole event "
                     f"(a write cut short): the log now ends before it; its bytes are in {aside}")

    # --- the run's input secret ----------------------------------------------------------------

    def seed_secret(self) -> int:
        """The secret every evaluator of this run mixes into its input seeds (evaluation/seeds.py): drawn
        once, when the run starts, and kept in `seed_secret` (0600) so that a resumed session generates
        the same inputs. The run directory is outside every candidate's view (the sandbox), so no
        candidate can read it there; without isolation a candidate has the user's rights, this included."""
        path = self.root / "seed_secret"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            text = path.read_text().strip()
            if not text.isdigit():
                raise RunDirError(f"{path} does not hold a seed secret (a number); restore it or remove it") from None
            return int(text)
        secret = secrets.randbits(63)
        with os.fdopen(fd, "w") as f:
            f.write(f"{secret}\n")
            f.flush()
            os.fsync(f.fileno())
        return secret

    # --- solutions, best -------------------------------------------------------------

    def save_solution(self, solution: Solution) -> str:
        path = self.solutions_dir / f"{solution.id}.json"
        if not path.exists():
            atomic_write(path, solution.model_dump_json(indent=1))
        return solution.id

    def has_solution(self, solution_id: str) -> bool:
        return (self.solutions_dir / f"{solution_id}.json").is_file()

    def load_solution(self, solution_id: str) -> Solution:
        return Solution.model_validate_json((self.solutions_dir / f"{solution_id}.json").read_text())

    def write_best(self, payload: dict[str, Any], solution: Solution) -> None:
        """best.json (the record), and the solution's sources as plain files in best/."""
        best = self.root / "best"
        with writing(best):
            best.mkdir(exist_ok=True)
            for old in best.iterdir():
                if old.name not in solution.sources:
                    old.unlink()
        for name, text in solution.sources.items():
            atomic_write(best / name, text)
        atomic_write(self.root / "best.json", json.dumps(payload, indent=2, default=str))
