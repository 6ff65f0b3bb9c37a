"""What Triton's system shared memory saves against binary tensors, on a large batch.

One server (one worker), one tritonclient HTTP client, the same batch of SST-2 sentences
(`--texts`, default the --max-texts limit of 256) sent `--rounds` times each way, alternating:
binary tensors (input and outputs in the HTTP body, the binary extension) and system shared
memory (input read from, outputs `scores` and `embedding` written to, regions registered once).
Per request it prints the client's wall time (median), the tensor bytes that cross the socket
each way, and the server front-end's CPU time (where the two paths differ: the model's time is
the same).

    python -m benchmarks.shm_transfer [--texts 256] [--rounds 8]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
import psutil
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import serialize_byte_tensor

from devkit.launcher import load_texts
from devkit.server import ServerProc, serving

MODEL = "sst2-minilm"
OUTPUTS = ("scores", "embedding")
Request = tuple[list[Any], list[Any]]  # tritonclient's inputs and requested outputs


def measure(
    client: httpclient.InferenceServerClient, front: psutil.Process, send: Callable[[], Request]
) -> tuple[float, float]:
    """(wall ms, server front-end CPU ms) of one request."""
    cpu0 = sum(front.cpu_times()[:2])
    t0 = time.perf_counter()
    inputs, outputs = send()
    client.infer(MODEL, inputs, outputs=outputs)
    wall = (time.perf_counter() - t0) * 1000
    return wall, (sum(front.cpu_times()[:2]) - cpu0) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    texts = np.array([t.encode() for t in load_texts(n=args.texts)], dtype=np.object_)
    batch = texts.reshape(-1, 1)
    data = serialize_byte_tensor(batch)
    size_in = len(data.item())  # tritonclient serializes BYTES into one bytes object
    out_size = args.texts * (2 + 384) * 4
    tmp = Path(tempfile.mkdtemp())
    with serving(ServerProc(tmp, ["--workers", "1", "--spares", "0"]), 1) as srv:
        front = psutil.Process(srv.proc.pid)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{srv.port}", network_timeout=300)
        key_in, key_out = f"/rs-bench-in-{srv.port}", f"/rs-bench-out-{srv.port}"
        region_in = shm.create_shared_memory_region("in", key_in, size_in)
        region_out = shm.create_shared_memory_region("out", key_out, out_size)
        try:
            shm.set_shared_memory_region(region_in, [data])
            client.register_system_shared_memory("in", key_in, size_in)
            client.register_system_shared_memory("out", key_out, out_size)

            def binary() -> Request:
                inp = httpclient.InferInput("text", list(batch.shape), "BYTES")
                inp.set_data_from_numpy(batch, binary_data=True)
                return [inp], [
                    httpclient.InferRequestedOutput(n, binary_data=True) for n in OUTPUTS
                ]

            def shared() -> Request:
                inp = httpclient.InferInput("text", list(batch.shape), "BYTES")
                inp.set_shared_memory("in", size_in)
                outs = []
                offset = 0
                for name, size in (("scores", args.texts * 8), ("embedding", args.texts * 1536)):
                    out = httpclient.InferRequestedOutput(name)
                    out.set_shared_memory("out", size, offset=offset)
                    outs.append(out)
                    offset += size
                return [inp], outs

            measure(client, front, binary)  # warm both paths
            measure(client, front, shared)
            paths = {"binary tensors": binary, "system shared memory": shared}
            rows: dict[str, list[tuple[float, float]]] = {name: [] for name in paths}
            for _ in range(args.rounds):  # alternate, so drift falls on both
                for name, send in paths.items():
                    rows[name].append(measure(client, front, send))
            tensor_bytes = {
                "binary tensors": (size_in, out_size),
                "system shared memory": (0, 0),
            }
            print(f"{args.texts} texts a request, {args.rounds} requests each way, alternating")
            print(f"{'path':<22}{'wall ms':>10}{'front CPU ms':>14}{'tensor B in':>13}{'out':>10}")
            for name, got in rows.items():
                wall = median(r[0] for r in got)
                cpu = median(r[1] for r in got)
                t_in, t_out = tensor_bytes.get(name, (0, 0))
                print(f"{name:<22}{wall:>10.1f}{cpu:>14.1f}{t_in:>13}{t_out:>10}")
            client.unregister_system_shared_memory()
        finally:
            shm.destroy_shared_memory_region(region_in)
            shm.destroy_shared_memory_region(region_out)
            client.close()


if __name__ == "__main__":
    main()
