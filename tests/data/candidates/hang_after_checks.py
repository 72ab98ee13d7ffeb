"""Right on the correctness calls (one per workload), then it never returns: a hang in the warm-up."""

_calls = 0


def run(x, a, b):
    global _calls
    _calls += 1
    if _calls > 2:
        while True:
            pass
    return a * x + b
