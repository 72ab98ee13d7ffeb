# Reads a secret from the user's real home; a wrong answer tells the test it succeeded.
TARGET = "@TARGET@"


def run(x, a, b):
    try:
        with open(TARGET) as f:
            f.read()
    except OSError:
        return a * x + b
    return a * x + b + 1.0
