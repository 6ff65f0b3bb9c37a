"""A worker's heartbeat (workers.process.worker.Worker.beat) over a real control block: with
lanes, a lane stuck in its batch ages the beat while another lane still loops, as one loop
stuck in a batch would; with no batch running it is stamped now."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from ringserve.shm.channel import Channel, Doorbells
from ringserve.workers.process.worker import Worker
from ringserve.workers.spec import WorkerSpec


@pytest.fixture
def worker() -> Iterator[Worker]:
    serial = 990_000 + os.getpid() % 9_000
    channel, bells = Channel.create(os.getpid(), serial, 64, 256), Doorbells()
    spec = WorkerSpec(
        serial=serial, parent_pid=os.getpid(), cpus=[0, 1], threads=1, device="cpu",
        model_dir="", channel=channel.names, buckets=(), max_batch=8, max_delay_ms=0.0,
        doorbell=bells.request, eventfd=bells.answer, runtime="onnx", lanes=2,
    )  # fmt: skip
    made = Worker(spec)
    try:
        yield made
    finally:
        made.close()
        channel.close()
        channel.unlink()
        bells.close()


def test_a_lane_stuck_in_its_batch_ages_the_heartbeat(worker: Worker) -> None:
    stuck_since = time.monotonic_ns() - 3_000_000_000  # lane 1's batch began 3 s ago
    worker.lanes.started_ns = [0, stuck_since]
    worker.beat()  # lane 0 loops on
    age = worker.ctl.heartbeat_age_ms()
    assert age is not None and age >= 3000
    worker.lanes.started_ns = [time.monotonic_ns(), 0]  # lane 1 done; lane 0 just began a batch
    worker.beat()
    age = worker.ctl.heartbeat_age_ms()
    assert age is not None and age < 1000


def test_one_lane_beats_now(worker: Worker) -> None:
    worker.lanes.started_ns = [0, 0]
    worker.ctl.beat(1)  # long ago
    worker.beat()
    age = worker.ctl.heartbeat_age_ms()
    assert age is not None and age < 1000
