from abc import ABC, abstractmethod


class Shape(ABC):
    @abstractmethod
    def area(self) -> float: ...


class Square(Shape):
    def __init__(self, side: float) -> None:
        self._side = side

    @property
    def side(self) -> float:
        return self._side

    @classmethod
    def unit(cls) -> "Square":
        return cls(1)

    @staticmethod
    def describe() -> str:
        return "square"

    def area(self) -> float:
        return self._side**2


print(Square.unit().area(), Square(3).side, Square.describe())
