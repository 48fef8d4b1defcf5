"""django_weft's Django admin (the run screens arrive in the next commits)."""
