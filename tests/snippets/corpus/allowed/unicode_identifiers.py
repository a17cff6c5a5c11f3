café = "crème"
π = 3.14159
naïve_total = len(café) + π
print(naïve_total)
