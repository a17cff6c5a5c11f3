def countdown(n: int):
    while n > 0:
        yield n
        n -= 1


def pipeline():
    yield from countdown(3)
    yield 0


print(list(pipeline()))
