import re

pattern = re.compile(r"(?P<key>\w+)=(?P<value>\d+)")
for m in pattern.finditer("a=1 b=22 c=333"):
    print(m.group("key"), int(m.group("value")))
