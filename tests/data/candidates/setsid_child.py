# Leaves a process behind in a session of its own (the test looks for TARGET in command lines).
import subprocess

TARGET = "@TARGET@"
_started = []


def run(x, a, b):
    if not _started:
        _started.append(subprocess.Popen(["sleep", TARGET], start_new_session=True,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return a * x + b
