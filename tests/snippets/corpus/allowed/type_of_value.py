values = [1, "a", 2.0, None]
print([type(v).__name__ for v in values], isinstance(int, type))
print(hasattr([], "append"))
