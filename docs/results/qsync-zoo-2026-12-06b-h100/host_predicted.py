"""Predicted against measured host time of every plan of this run: the zoo run before's
host_predicted.py (docs/results/qsync-zoo-2026-12-06-h100/) on this run's logs. Needs the
two calls' returned archives unpacked (their traces are not committed: about 22 MB a
call), each re-predicted (validate.py --predict, the run log's command), and lowbit-plan:

    python3 docs/results/qsync-zoo-2026-12-06b-h100/host_predicted.py LOWBIT_PLAN \\
        part1=DIR part2=DIR > host_predicted.csv
    python3 docs/results/qsync-zoo-2026-12-06b-h100/host_predicted.py --summary host_predicted.csv
"""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "host_predicted_before", os.path.join(HERE, "../qsync-zoo-2026-12-06-h100/host_predicted.py"))
hp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hp)
hp.HERE = HERE  # the run logs read are this run's

if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        hp.summary(sys.argv[2])
    else:
        hp.table(sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]])
