import math
import statistics
from fractions import Fraction
from decimal import Decimal

values = [1.0, 2.5, 3.5, 10.0]
print(math.sqrt(2), math.pi, statistics.mean(values), statistics.median(values))
print(Fraction(3, 4) + Fraction(1, 4), Decimal("0.1") + Decimal("0.2"))
