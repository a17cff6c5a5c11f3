from __future__ import annotations

from typing import Callable, Literal, Union


def apply(fn: Callable[[int], int], mode: Literal["a", "b"], x: int | None = None) -> Union[int, str]:
    return fn(x or 0) if mode == "a" else "b"


print(apply(lambda v: v + 1, "a", 2))
