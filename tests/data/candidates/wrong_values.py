def run(x, a, b):
    y = a * x + b
    y[7] += 0.5
    return y
