# Kills another process of the same user (the test's pid in TARGET).
import os
import signal

TARGET = "@TARGET@"


def run(x, a, b):
    try:
        os.kill(int(TARGET), signal.SIGKILL)
    except OSError:
        pass
    return a * x + b
