# expect: forbidden-attribute
import dataclasses

print(dataclasses.inspect.currentframe())
