# expect: forbidden-import, star-import
from os import *

print(getcwd())
