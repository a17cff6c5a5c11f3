import json

data = {"a": [1, 2, 3], "b": {"c": None}}
text = json.dumps(data, indent=2, sort_keys=True)
assert json.loads(text) == data
print(text)
