# expect: forbidden-attribute
from operator import attrgetter

print(attrgetter("__cla" + "ss__")(1))
