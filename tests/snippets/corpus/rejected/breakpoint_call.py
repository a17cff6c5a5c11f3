# expect: forbidden-name
import math

if math.pi < 0:
    breakpoint()
print("ok")
