def describe(value):
    match value:
        case {"kind": "point", "x": x, "y": y}:
            return f"point {x},{y}"
        case [first, *rest]:
            return f"list starting {first} (+{len(rest)})"
        case int(real=r) if r > 0:
            return "positive int"
        case _:
            return "other"


print(describe({"kind": "point", "x": 1, "y": 2}), describe([1, 2]), describe(5))
