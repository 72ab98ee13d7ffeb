"""The world model's record in a run directory: one delta per tree version, and full checkpoints now and then.

    world_model/deltas.jsonl    one line per version: what changed (`worldmodel.delta`), and the call;
                                a line {"checkpoint": V} where a writer wrote v<V>.json
    world_model/v<V>.json       the whole tree at version V (a checkpoint)

Whoever holds the tree (the WorldModelActor, or the local world model without Ray) writes it. A
checkpoint is written when a writer starts (a run, a resume, a replaced actor), when it closes, and
whenever the deltas written since the last checkpoint outweigh that checkpoint (and 256 KB): the
checkpoints then never weigh more than the deltas, so the record grows with what changed (linearly
in rounds), and a version is rebuilt from one checkpoint and at most about its size in deltas.

Before the deltas, a run directory held a whole v<V>.json for every version (and latest.json);
`read_tree` reads both layouts, and a resumed old run continues as deltas after its last snapshot.

A writer killed before the driver logged its last call leaves versions the event log never reached;
the next writer starts again from the logged version with a checkpoint line, and the reader keeps
the later history from there (as the old layout overwrote such snapshots). A line cut short by a
kill is ended by the next writer and passed over by the reader.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, TextIO

from ksearch_ray.store import RunDirError, atomic_write, writing
from ksearch_ray.worldmodel.delta import patch, tree_delta
from ksearch_ray.worldmodel.tree import Tree

DELTAS = "deltas.jsonl"
MIN_DELTA_BYTES = 256 * 1024
"""Deltas between checkpoints at least: early in a run the tree is smaller than this."""
_CHECKPOINT = re.compile(r"^v(\d+)\.json$")


def record_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "world_model"


class TreeRecord:
    """Writes the record of one holder of the tree, from the tree it starts with."""

    def __init__(self, run_dir: Path, tree: Tree, *, min_delta_bytes: int | None = None):
        self.dir = record_dir(run_dir)
        self.path = self.dir / DELTAS
        self.min_delta_bytes = MIN_DELTA_BYTES if min_delta_bytes is None else min_delta_bytes
        self.tree = tree
        """The tree as of the last version recorded (renewals move expiry times without a version)."""
        self.checkpoint_bytes = 0
        self.delta_bytes = 0
        """Bytes of deltas since the last checkpoint."""
        with writing(self.path):
            self.dir.mkdir(parents=True, exist_ok=True)
            cut = self.path.exists() and self.path.stat().st_size > 0 and not _ends_in_newline(self.path)
            self._fh: TextIO | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115  (held while the tree is)
            if cut:  # a line a killed writer cut short: ended here, so that ours starts on a line of its own
                self._fh.write("\n")
        self.checkpoint()

    def changed(self, tree: Tree, call: str) -> None:
        """Record `tree` if it is a new version (made by `call`)."""
        if tree.version == self.tree.version:
            return
        delta = tree_delta(self.tree, tree)
        delta["call"] = call
        self.delta_bytes += self._line(delta)
        self.tree = tree
        if self.delta_bytes >= max(self.checkpoint_bytes, self.min_delta_bytes):
            self.checkpoint()

    def checkpoint(self) -> None:
        text = self.tree.model_dump_json()
        atomic_write(self.dir / f"v{self.tree.version:05d}.json", text)
        self._line({"checkpoint": self.tree.version})
        self.checkpoint_bytes, self.delta_bytes = len(text), 0

    def close(self) -> None:
        """A last checkpoint (if anything changed since the last), and the file closed."""
        if self._fh is None:
            return
        if self.delta_bytes:
            self.checkpoint()
        with writing(self.path):
            self._fh.close()
        self._fh = None

    def _line(self, data: dict[str, Any]) -> int:
        text = json.dumps(data, separators=(",", ":")) + "\n"
        if self._fh is None:
            raise RuntimeError("the world model's record was closed")  # a bug of its holder
        with writing(self.path):
            self._fh.write(text)
            self._fh.flush()
        return len(text)


def _ends_in_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1) == b"\n"


class RecordedTrees:
    """The versions a run directory's record holds, either layout, and any of them rebuilt."""

    def __init__(self, run_dir: Path):
        self.dir = record_dir(run_dir)
        self._entries: list[dict[str, Any]] = []
        self._chains: dict[int, tuple[int, int]] = {}
        """version -> (its checkpoint line, its own line) in the delta log."""
        self._files = {int(m.group(1)): p for p in self.dir.glob("v*.json") if (m := _CHECKPOINT.match(p.name))}
        if (self.dir / DELTAS).exists():
            self._read_log(self.dir / DELTAS)
        first_logged = min((e["checkpoint"] for e in self._entries if "checkpoint" in e), default=None)
        # The old layout: a whole tree per version, up to where a resumed run went on in deltas.
        self._whole = {v for v in self._files if v not in self._chains and (first_logged is None or v < first_logged)}

    def _read_log(self, path: Path) -> None:
        lines = path.read_text(encoding="utf-8").splitlines()
        start: int | None = None
        for number, line in enumerate(lines, start=1):
            try:
                entry = json.loads(line)
            except ValueError:
                after = lines[number] if number < len(lines) else None
                if after is None or '"checkpoint"' in after:  # cut short, then ended by the next writer
                    continue
                raise RunDirError(f"{path}: line {number} of {len(lines)} is not JSON, and no writer started after it") from None
            self._entries.append(entry)
            index = len(self._entries) - 1
            if "checkpoint" in entry:
                version = entry["checkpoint"]
                # A writer starts again from the version the event log reached: later ones were never logged.
                for stale in [v for v in self._chains if v > version]:
                    del self._chains[stale]
                start = index
            elif start is None:
                raise RunDirError(f"{path}: line {number} is a delta before any checkpoint")
            self._chains[entry.get("checkpoint", entry.get("version"))] = (start, index)

    def versions(self) -> list[int]:
        return sorted(self._whole | set(self._chains))

    def tree(self, version: int | None = None) -> Tree:
        """The tree at `version` (the last recorded one by default)."""
        known = self.versions()
        if not known:
            raise RunDirError(f"{self.dir} holds no world model")
        version = known[-1] if version is None else version
        if version in self._whole:
            return Tree.model_validate_json(self._files[version].read_text())
        if version not in self._chains:
            raise RunDirError(f"{self.dir} holds no version {version} of the world model (it holds {known[0]}-{known[-1]})")
        start, end = self._chains[version]
        base = self._entries[start]["checkpoint"]
        if base not in self._files:
            raise RunDirError(f"{self.dir}: checkpoint v{base:05d}.json is missing")
        data = json.loads(self._files[base].read_text())
        for delta in self._entries[start + 1 : end + 1]:
            patch(data, delta)
        tree = Tree.model_validate(data)
        if tree.version != version:
            raise RunDirError(f"{self.dir}: rebuilding version {version} gave version {tree.version}")
        return tree


def read_tree(run_dir: Path, version: int | None = None) -> Tree:
    """A run's world model at `version` (default: the last recorded), from either layout of its record."""
    return RecordedTrees(run_dir).tree(version)
