import module_that_does_not_exist  # noqa: F401


def run(x, a, b):
    return a * x + b
