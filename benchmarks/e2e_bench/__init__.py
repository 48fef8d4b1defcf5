"""The end-to-end benchmark's Django project (``benchmarks/end_to_end.py``)."""
