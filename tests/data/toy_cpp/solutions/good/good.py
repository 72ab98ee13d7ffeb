def run(x, a, b):
    return a * x + b
