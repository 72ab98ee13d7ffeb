# Prints a secret value it found somewhere (here, written into its source), and fails with it.
SECRET = "@TARGET@"


def run(x, a, b):
    print(f"found {SECRET}", flush=True)
    raise RuntimeError(f"the key is {SECRET}")
