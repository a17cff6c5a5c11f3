from contextlib import contextmanager


@contextmanager
def tag(name: str):
    print(f"<{name}>")
    yield name
    print(f"</{name}>")


class Timer:
    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False


with tag("p") as t, Timer():
    print("inside", t)
