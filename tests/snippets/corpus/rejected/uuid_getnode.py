# expect: forbidden-attribute
import uuid

print(uuid.getnode())
