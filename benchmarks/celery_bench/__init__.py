"""The Django project and Celery app of ``benchmarks/celery_throughput.py``."""
