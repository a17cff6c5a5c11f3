# expect: forbidden-import
import pickle

print(pickle.dumps(1))
