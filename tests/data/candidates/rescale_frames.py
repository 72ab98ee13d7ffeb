# Walks up its callers' frames and shrinks every list of timings it finds there by 1000x.
import sys

CHEAT = "@TARGET@" == "cheat"


def _shrink(value):
    if isinstance(value, list) and value and all(isinstance(v, float) for v in value):
        value[:] = [v * 1e-3 for v in value]
    elif isinstance(value, dict):
        for v in value.values():
            _shrink(v)


def run(x, a, b):
    y = a * x + b
    for _ in range(300):  # enough work for a stable time
        y = a * x + b
    if CHEAT:
        frame = sys._getframe(1)
        while frame is not None:
            for value in list(frame.f_locals.values()):
                _shrink(value)
                for attr in getattr(value, "__dict__", {}).values():
                    _shrink(attr)
            frame = frame.f_back
    return y
