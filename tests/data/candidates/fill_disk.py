# Fills its job directory with 4 MiB files, up to 1 GiB, at a few hundred MiB/s.
import os
import time


def run(x, a, b):
    os.makedirs("junk", exist_ok=True)
    for i in range(256):
        with open(f"junk/{i}.bin", "wb") as f:
            f.write(os.urandom(1 << 10) * 4096)
        time.sleep(0.01)
    return a * x + b
