async def add(a: int, b: int) -> int:
    return a + b


async def main() -> int:
    return await add(1, 2)


coro = main()
try:
    coro.send(None)
except StopIteration as stop:
    print("result", stop.value)
