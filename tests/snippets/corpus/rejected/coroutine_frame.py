# expect: forbidden-attribute
async def job():
    return 1


c = job()
print(c.cr_frame.f_globals)
c.close()
