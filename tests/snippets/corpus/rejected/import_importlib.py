# expect: forbidden-import
import importlib

print(importlib.import_module("os").getcwd())
