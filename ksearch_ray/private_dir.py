"""Private directories: every cache and scratch folder the project keeps outside a run directory.

A folder that another local user can create or write (a predictable name under a shared /tmp, a
group-writable cache) lets that user plant files the project later trusts: a generated task bundle
whose code runs, a library that is loaded. So every such folder is made here, level by level, mode
0700, and checked before each use: a real directory (not a link), owned by this user, writable by
nobody else. A folder that fails is refused (`PrivateDirError`, one line), never repaired: whoever
made it may still hold it.

Caches live under `cache_root()`: `$XDG_CACHE_HOME/ksearch-ray`, else `~/.cache/ksearch-ray`, never
a shared temporary directory. What they hold is keyed by a hash of its inputs and verified against a
manifest of content hashes before reuse (`write_manifest`, `manifest_matches`).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

MANIFEST = ".ksearch-manifest.json"


class PrivateDirError(Exception):
    """A folder that is not this user's alone (or cannot be made so): one line, for the user."""


def cache_root() -> Path:
    """The project's per-user cache folder (not created here)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "ksearch-ray"
    try:
        return Path.home() / ".cache" / "ksearch-ray"
    except RuntimeError:  # no HOME and no password entry
        raise PrivateDirError("no home directory for a cache: set XDG_CACHE_HOME to a folder of your own") from None


def check_private(path: Path) -> None:
    """Refuse `path` unless it is a real directory owned by this user that no one else can write."""
    try:
        info = path.lstat()
    except OSError as exc:
        raise PrivateDirError(f"{path}: cannot be used as a private folder ({exc.strerror})") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise PrivateDirError(f"{path} is not a directory of its own (a link or a file); remove it")
    if info.st_uid != os.geteuid():
        raise PrivateDirError(f"{path} is owned by uid {info.st_uid}, not by this user (uid {os.geteuid()}): "
                              "refusing to use a folder another user made; remove it")
    if info.st_mode & 0o022:
        raise PrivateDirError(f"{path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):o}): "
                              "refusing to use it; remove it or chmod go-w")


def private_dir(path: Path, *, base: Path | None = None) -> Path:
    """`path`, made 0700 where missing and checked, level by level from `base` down (the levels the
    project owns; `base` itself is checked too). Without `base`, only `path` is made 0700 and checked
    (its parents, the user's choice of place, are made as usual where missing)."""
    path = Path(path)
    levels = [path]
    if base is None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)  # the user's choice of place: only `path` is ours
        except OSError as exc:
            raise PrivateDirError(f"cannot create {path.parent} ({exc.strerror})") from None
    else:
        base = Path(base)
        if not path.is_relative_to(base):
            raise ValueError(f"{path} is not under {base}")
        rel = path.relative_to(base).parts
        levels = [base, *(base.joinpath(*rel[:i + 1]) for i in range(len(rel)))]
        if base.parent != base:
            try:
                base.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as exc:
                raise PrivateDirError(f"cannot create {base.parent} ({exc.strerror})") from None
    for level in levels:
        try:
            level.mkdir(mode=0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise PrivateDirError(f"cannot create {level} ({exc.strerror})") from None
        check_private(level)
    return path


def cache_dir(*parts: str) -> Path:
    """A private folder under the per-user cache root, made and checked at every level."""
    root = cache_root()
    try:
        return private_dir(root.joinpath(*parts), base=root)
    except PrivateDirError as exc:
        raise PrivateDirError(f"{exc} (the cache folder comes from XDG_CACHE_HOME, else ~/.cache)") from None


# --- verified content ---------------------------------------------------------------------------


def _file_hashes(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if rel == MANIFEST:
            continue
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = "other"
    return out


def write_manifest(root: Path, key: str) -> None:
    """Record what `root` holds (every path and the sha256 of every file) under the cache key `key`."""
    (root / MANIFEST).write_text(json.dumps({"key": key, "files": _file_hashes(root)}, indent=1, sort_keys=True))


def manifest_matches(root: Path, key: str) -> bool:
    """Whether `root` holds exactly what its manifest says, made for `key`: no file changed, added or missing."""
    try:
        recorded = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(recorded, dict) and recorded.get("key") == key and recorded.get("files") == _file_hashes(root)
