# Prints 1 GiB on stdout, then crashes: the evaluator must neither store it nor read it whole.
import os
import sys

LINE = ("spam " * 200 + "\n").encode()


def run(x, a, b):
    out = sys.stdout.buffer
    for _ in range((1 << 30) // len(LINE) + 1):
        out.write(LINE)
    out.flush()
    os.abort()
