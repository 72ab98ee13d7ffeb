# Searches the garbage collector's objects for the harness's timings and shrinks them 1000x.
import gc

CHEAT = "@TARGET@" == "cheat"


def run(x, a, b):
    y = a * x + b
    for _ in range(300):
        y = a * x + b
    if CHEAT:
        for obj in gc.get_objects():
            if isinstance(obj, list) and obj and all(isinstance(v, float) for v in obj):
                obj[:] = [v * 1e-3 for v in obj]
            elif isinstance(obj, dict) and "times_ms" in obj:
                obj["times_ms"] = [v * 1e-3 for v in obj["times_ms"]]
    return y
