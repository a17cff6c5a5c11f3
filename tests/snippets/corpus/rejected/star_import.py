# expect: star-import
from math import *

print(pi)
