# expect: forbidden-attribute
# make_dataclass builds a class from run-time strings and a namespace mapping.
import dataclasses

print(dataclasses.make_dataclass("P", ["x"], namespace={"y": 1}))
