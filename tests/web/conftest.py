from tests.people import _fast_password_hashing  # noqa: F401 - autouse fixture
