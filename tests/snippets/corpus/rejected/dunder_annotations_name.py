# expect: dunder-name
x: int = 1
print(__annotations__)
