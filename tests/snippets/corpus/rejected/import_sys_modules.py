# expect: forbidden-attribute, forbidden-import
import sys

print(sorted(sys.modules)[:5])
