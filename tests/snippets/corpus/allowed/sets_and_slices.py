data = list(range(20))
print(data[::2], data[-3:], data[1:5])
a, b = {1, 2, 3}, {2, 3, 4}
print(a | b, a & b, a - b, a ^ b)
first, *middle, last = data
print(first, len(middle), last)
