# expect: private-module-attribute
from typing import _eval_type

print(_eval_type)
