# expect: module-value
# A module bound to another name escapes the module-attribute checks: r._os is random's os.
import random

r = random
print(r._os.getcwd())
