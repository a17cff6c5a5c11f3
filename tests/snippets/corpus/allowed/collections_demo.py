from collections import Counter, OrderedDict, defaultdict, deque, namedtuple
from collections.abc import Iterable

Point = namedtuple("Point", "x y")
counts = Counter("mississippi")
groups: defaultdict[str, list[int]] = defaultdict(list)
groups["a"].append(1)
queue = deque([1, 2, 3], maxlen=5)
print(Point(1, 2), counts.most_common(2), dict(groups), queue, OrderedDict(a=1))
print(isinstance([], Iterable))
