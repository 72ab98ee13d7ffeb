def run(x, a, b):
    while True:
        pass
