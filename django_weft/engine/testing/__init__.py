"""Test support for the engine: an in-memory store and a recording dispatcher, to drive
the real :class:`~django_weft.engine.executor.Engine` without Django or a database.

Nothing in the package imports this; it is for tests only.
"""
