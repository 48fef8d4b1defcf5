"""The example project: a Django site that fulfils orders with a durable workflow."""

from .celery import app as celery_app

__all__ = ("celery_app",)
