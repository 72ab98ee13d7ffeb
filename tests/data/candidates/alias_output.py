def run(x, a, b):
    return x.mul_(a).add_(b)  # the answer, written over an input
