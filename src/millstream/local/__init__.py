"""Processes Millstream starts on this machine for a local cluster and the demo.

:mod:`millstream.local.process` is the generic managed child process (a port, a log file,
start/stop by PID); :mod:`millstream.local.tansu` is the Tansu Kafka-protocol broker that
``millstream up`` and ``millstream demo`` run.
"""
