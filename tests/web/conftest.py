from tests.web.people import (  # noqa: F401 - fixtures
    _fast_password_hashing,
    approver,
    requester,
    requester_client,
    stranger,
    viewer,
    viewer_client,
)
