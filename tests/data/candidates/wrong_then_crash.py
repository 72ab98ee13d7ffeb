import os

_calls = []


def run(x, a, b):
    # Wrong on the first workload, then dies on the second: the first failure must decide.
    _calls.append(1)
    if len(_calls) > 1:
        os.abort()
    return a * x + b + 1.0
