def run(x, a, b):
    return a * x + b[0]  # b is a float: TypeError
