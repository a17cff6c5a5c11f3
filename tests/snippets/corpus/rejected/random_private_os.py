# expect: private-module-attribute
import random

print(random._os.getcwd())
