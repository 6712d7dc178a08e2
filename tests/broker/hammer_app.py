"""A Celery app of its own on the embedded broker, for tests/broker: no Django, one task.

HAMMER_BROKER_DIR is the broker's data folder; HAMMER_RECORD the file each
task run appends one line to ("<publisher> <number>"), so a test can count
deliveries.
"""

from __future__ import annotations

import os

from celery import Celery

from gpuadmin.broker.filesystem import TRANSPORT_PATH

QUEUE = "hammer"

app = Celery("hammer")
app.conf.update(
    broker_url="filesystem://localhost/",
    broker_transport=TRANSPORT_PATH,
    broker_transport_options={"data_folder": os.environ.get("HAMMER_BROKER_DIR", "")},
    broker_connection_retry_on_startup=True,
    task_default_queue=QUEUE,
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    worker_prefetch_multiplier=4,
    worker_hijack_root_logger=False,
)


@app.task(name="hammer.record")
def record(publisher: int, number: int) -> None:
    # O_APPEND: each line lands whole, even with several pool processes writing.
    fd = os.open(os.environ["HAMMER_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{publisher} {number}\n".encode())
    finally:
        os.close(fd)
