# Grows its heap 256 MiB at a time (pages written, so they are really used) up to 6 GiB.
CHUNK = 256 << 20
TOTAL = 6 << 30


def run(x, a, b):
    hoard = []
    while len(hoard) * CHUNK < TOTAL:
        hoard.append(b"x" * CHUNK)
    return a * x + b
