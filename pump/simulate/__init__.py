"""pump simulate: a discrete-event model of Unified Memory under each prefetch policy.

constants.py holds every constant of the model and its source; workload.py turns a trace into
launches; engine.py replays them under a policy and a capacity; report.py prints and plots."""
