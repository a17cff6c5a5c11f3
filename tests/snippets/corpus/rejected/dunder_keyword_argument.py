# expect: dunder-subscript
# dict(__module__=...) is the same namespace key as a keyword argument.
T = type(type(1))
C = T("C", (), dict(__module__="logging"))
print(C)
