# expect: forbidden-attribute
import typing

print(sorted(typing.sys.modules)[:3])
