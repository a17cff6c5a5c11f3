# expect: unresolved-relative-import
from . import helpers

print(helpers)
