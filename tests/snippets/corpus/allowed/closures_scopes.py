counter = 0


def make_counter():
    count = 0

    def inc():
        nonlocal count
        count += 1
        return count

    return inc


def bump():
    global counter
    counter += 1


c = make_counter()
c()
bump()
print(c(), counter)
