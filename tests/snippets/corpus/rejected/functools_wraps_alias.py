# expect: forbidden-attribute
# wraps used as a value (renamed, passed around) could later be called with any arguments.
from functools import wraps as w

print(w)
