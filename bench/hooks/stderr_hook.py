# Bench hook for after_turn: writes stderr lines that carry their own write time, or a burst of lines.
#   "latency:<marker>:<n>"  n lines "L <marker> <i> <time.time()>", 5 ms apart
#   "burst:<marker>:<n>"    n lines "B <marker> <i>" as fast as it can
import json
import sys
import time

req = json.loads(sys.stdin.read())
mode, marker, n = req["messages"][0]["content"].split(":")
for i in range(int(n)):
    if mode == "latency":
        print(f"L {marker} {i} {time.time():.6f}", file=sys.stderr, flush=True)
        time.sleep(0.005)
    else:
        sys.stderr.write(f"B {marker} {i}\n")
print(json.dumps({"type": "ok"}))
