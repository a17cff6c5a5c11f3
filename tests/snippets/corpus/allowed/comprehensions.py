squares = [n * n for n in range(10)]
evens = {n for n in squares if n % 2 == 0}
index = {n: i for i, n in enumerate(squares)}
gen = sum(x for x in squares if x > 10)
print(squares, evens, index, gen)
