# Appends a forged event to a run directory's log (the test puts the path in TARGET).
TARGET = "@TARGET@"


def run(x, a, b):
    try:
        with open(TARGET, "a") as f:
            f.write('{"kind": "best", "speedup": 1000}\n')
    except OSError:
        pass
    return a * x + b
