import functools


def logged(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        print("calling", fn.__name__)
        return fn(*args, **kwargs)

    return wrapper


@logged
def double(x):
    return x * 2


print(sorted([3, 1, 2], key=lambda v: -v), double(4))
