# Writes down when its code runs (wall clock), where its evaluation leaves the file: its own Triton cache.
import os
import time

_LOG = os.path.join(os.environ["TRITON_CACHE_DIR"], "clock_spy.log")


def _note(what):
    with open(_LOG, "a") as f:
        f.write(f"{what} {time.time()!r}\n")


_note("import")


def run(x, a, b):
    _note("call")
    return a * x + b
