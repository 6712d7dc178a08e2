"""What gpuadmin adds to kombu's transports: the embedded broker used when there is no REDIS_URL
(``filesystem.py``, docs/broker.md), and taking many messages of a queue off Redis at once, in kombu's
own bookkeeping (``redis_taking.py``)."""
