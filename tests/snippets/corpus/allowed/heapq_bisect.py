import bisect
import heapq

heap = [5, 1, 4, 2]
heapq.heapify(heap)
print([heapq.heappop(heap) for _ in range(len(heap))])
ordered = [1, 3, 5, 7]
bisect.insort(ordered, 4)
print(ordered, bisect.bisect_left(ordered, 5))
