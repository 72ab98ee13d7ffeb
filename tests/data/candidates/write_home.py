# Drops a file into the user's real home (the test puts the path in TARGET).
TARGET = "@TARGET@"


def run(x, a, b):
    try:
        with open(TARGET, "w") as f:
            f.write("planted by a candidate\n")
    except OSError:
        pass
    return a * x + b
