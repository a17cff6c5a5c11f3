# expect: forbidden-import
import ctypes

print(ctypes.sizeof(ctypes.c_int))
