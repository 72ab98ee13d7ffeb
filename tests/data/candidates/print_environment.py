# Prints its environment and fails, so that the evaluation's log (which goes back to the model, into
# the run's events and its report) carries whatever secrets it was given. LEAKED names the variables
# whose values the test planted (their values say "canary").
import os


def run(x, a, b):
    print(dict(os.environ), flush=True)
    leaked = sorted(k for k, v in os.environ.items() if "canary" in v)
    raise RuntimeError(f"LEAKED={leaked} " + " ".join(f"{k}={v}" for k, v in os.environ.items() if "canary" in v))
