# expect: forbidden-import
import os

print(os.getcwd())
