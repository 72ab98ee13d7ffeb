import sys


def run(x, a, b):
    sys.exit(0)  # a clean exit is still not a result
