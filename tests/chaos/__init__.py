"""The chaos suite: a workload of durable runs driven through worker crashes, pauses past
the lease, PostgreSQL restarts and a broker outage, then checked against invariants that
read only the database (docs/explanation/guarantees.md, "Tested under faults").

``python -m tests.chaos --seconds 120 --seed 7`` runs it (``scripts/chaos`` wraps it);
``tests/chaos/test_chaos.py`` is its bounded run in the suite, ``test_invariants.py``
proves that each invariant can fail.
"""
