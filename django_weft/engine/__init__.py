"""The framework-free core: registry, replay, retry math, durations, errors and ports.

Nothing in this package imports Django, Celery or DRF.
"""
