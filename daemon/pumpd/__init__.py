"""pumpd: pump's control plane.

It reads each job's launch and allocation events from the shim's event rings,
turns a job's history into a plan the shim carries out (prefetch triggers, a
budget), keeps sessions alive only while their processes are, and reports
status and metrics.  It runs as a system service (scripts/pumpd.service) or
embedded for one job by pump-run.  See server.py for the event loop.
"""
