"""gpuadmin: a web admin panel for labs that share GPU servers.

Every gpuadmin process imports this package first (``manage.py``, the WSGI
app, Celery workers and the agent, ``python -m gpuadmin.run`` and its
children, ``python -m gpuadmin.data_dir``), so this is the one place that
sets the file-creation mask: whatever gpuadmin writes (the SQLite database
and its WAL, broker messages, the agent's journal, keys) is readable by its
own user only. The database holds session keys: a copy would let a local user
act as an approver.
"""

import os

PRIVATE_UMASK = 0o077
os.umask(PRIVATE_UMASK)
