from enum import Enum, auto
from typing import Generic, Optional, TypeVar

T = TypeVar("T")


class Color(Enum):
    RED = auto()
    GREEN = auto()


class Box(Generic[T]):
    def __init__(self, item: T) -> None:
        self.item = item

    def get(self) -> Optional[T]:
        return self.item


print(Color.RED.name, Box(3).get())
