from dataclasses import dataclass, field


@dataclass(frozen=True)
class Item:
    name: str
    price: float
    tags: list[str] = field(default_factory=list)


items = [Item("a", 1.5), Item("b", 2.0, ["x"])]
print(sum(i.price for i in items))
