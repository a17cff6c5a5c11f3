import base64
import hashlib
import random
import uuid

random.seed(42)
print(random.randint(1, 6), random.choice("abc"))
print(hashlib.sha256(b"abc").hexdigest(), base64.b64encode(b"hi"))
print(uuid.uuid4().version)
