"""The example project's tests use django_weft's pytest plugin (its ``weft`` fixture),
turned on here, in the root conftest, as a project does."""

pytest_plugins = ["django_weft.testing"]
