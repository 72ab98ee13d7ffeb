#!/usr/bin/env python3
"""A stand-in for `ncu` on machines without one (tests): runs the command after `--log-file LOG`, then
writes a table of one kernel to LOG in ncu's `--csv --page raw --print-units base` shape. The kernel's
name reports what this process could do from where it ran: write HOST_FILE (w), reach the host's
loopback on HOST_PORT (n), see the host's processes (p). The test fills the @...@ markers in."""
import os
import socket
import subprocess
import sys

HOST_FILE = "@HOST_FILE@"
HOST_PORT = "@HOST_PORT@"

args = sys.argv[1:]
at = args.index("--log-file")
log, command = args[at + 1], args[at + 2:]
# Like ncu: the log is opened once, before the command runs, and written through that descriptor.
out = open(log, "w")  # noqa: SIM115
out.write("==PROF== Connected to process (fake)\n")
out.flush()
code = subprocess.call(command)
w = n = 0
try:
    with open(HOST_FILE, "w") as f:
        f.write("written by the profiler's wrapper\n")
    w = 1
except OSError:
    pass
try:
    socket.create_connection(("127.0.0.1", int(HOST_PORT)), timeout=2).close()
    n = 1
except OSError:
    pass
p = int(len([d for d in os.listdir("/proc") if d.isdigit()]) > 10)
header = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Block Size", "Grid Size",
          "gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed"]
units = ["", "", "", "", "", "", "", "nsecond", "%"]
row = ["0", str(os.getpid()), "python3", "127.0.0.1", f"fake_w{w}_n{n}_p{p}", "(128, 1, 1)", "(8, 1, 1)", "1500", "12.5"]
for cells in (header, units, row):
    out.write(",".join(f'"{c}"' for c in cells) + "\n")
out.close()
sys.exit(code)
