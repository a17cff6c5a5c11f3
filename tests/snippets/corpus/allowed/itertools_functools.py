import functools
import itertools
import operator

pairs = list(itertools.combinations("abcd", 2))
product = functools.reduce(operator.mul, range(1, 6))


@functools.lru_cache(maxsize=None)
def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


print(pairs, product, fib(30), list(itertools.accumulate([1, 2, 3])))
