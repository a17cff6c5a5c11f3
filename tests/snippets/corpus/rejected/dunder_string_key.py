# expect: dunder-subscript
namespace = {"__builtins__": None}
print(namespace["__builtins__"])
