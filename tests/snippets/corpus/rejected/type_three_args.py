# expect: dynamic-class
X = type("X", (), {"answer": 42})
print(X.answer)
