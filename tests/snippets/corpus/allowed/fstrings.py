name = "world"
width = 12
value = 3.14159
print(f"hello {name!r:>{width}} {value:.2f} {len(name) = }")
print("{} + {} = {}".format(1, 2, 3), "{name}".format(name=name))
