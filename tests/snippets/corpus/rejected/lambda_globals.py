# expect: dunder-attribute
namespace = (lambda: 0).__globals__
print(sorted(namespace))
