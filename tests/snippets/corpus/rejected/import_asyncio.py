# expect: forbidden-import
import asyncio

print(asyncio.run(asyncio.sleep(0, "done")))
