from tests.web.people import (  # noqa: F401 - fixtures
    approver,
    requester,
    requester_client,
    stranger,
    viewer,
    viewer_client,
)
