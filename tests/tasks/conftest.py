from tests.admin.conftest import admin_client_  # noqa: F401 - the admin tests' fixture
