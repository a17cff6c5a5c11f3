class Base:
    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"Base({self.name})"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)


class Child(Base):
    def __init__(self, name: str, age: int) -> None:
        super().__init__(name)
        self.age = age

    def __str__(self) -> str:
        return super().__str__() + f"+{self.age}"


print(Child("x", 3), type(Child("y", 1)).__name__, Child.__qualname__)
