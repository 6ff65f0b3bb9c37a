"""The ceiling's batch plans (benchmarks/serving.py): every text runs once, within its window,
in batches that respect the limit; the least-cost cut with no per-batch cost pads nothing. And
the steal share it prints beside each row."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from ringserve.workers.batches import row_limit

from benchmarks.serving import RUNTIMES, cpu_jiffies, options, plan, steal_pct


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 200), min_size=1, max_size=60),
    window=st.integers(1, 64),
    max_batch=st.integers(1, 64),
    max_tokens=st.sampled_from([64, 256, 512]),
    overhead=st.sampled_from([None, 0, 4, 11, 32]),
)
def test_a_plan_runs_every_text_once_within_its_window_and_the_limit(
    lengths: list[int], window: int, max_batch: int, max_tokens: int, overhead: int | None
) -> None:
    texts = [[n] * length for n, length in enumerate(lengths)]  # each text knows its index
    batches = plan(texts, window, max_batch, max_tokens, overhead)
    assert sorted(t[0] for b in batches for t in b) == list(range(len(texts)))
    for b in batches:
        longest = max(map(len, b))
        assert len(b) <= row_limit(longest, max_batch, max_tokens)
        assert len({t[0] // window for t in b}) == 1  # never across windows
    if overhead == 0:  # padding is all a batch costs: equal lengths only
        assert all(len(set(map(len, b))) == 1 for b in batches)


def test_the_greedy_cut_fills_each_batch_to_the_limit() -> None:
    texts = [[1] * n for n in [3, 5, 9, 9, 10, 20, 21, 40]]
    greedy = plan(texts, 8, 3, 60)
    assert [[len(t) for t in b] for b in greedy] == [[3, 5, 9], [9, 10, 20], [21], [40]]
    cheapest = plan(texts, 8, 3, 60, overhead=5)
    assert [[len(t) for t in b] for b in cheapest] == [[3, 5], [9, 9, 10], [20, 21], [40]]


def test_a_baseline_run_serves_the_defaults_alone_at_the_levels_asked() -> None:
    args, configs = options(["--levels", "32,64", "--baseline", "/elsewhere", "--rounds", "2"])
    assert args.levels == [32, 64] and args.rounds == 2
    assert configs == [RUNTIMES[0]] and args.peers == []  # each against its own ceilings
    args, configs = options(["--configs", "int8", "--mixes", "short"])
    assert args.levels == [1, 32, 64] and args.baseline is None and args.mixes == ["short"]
    assert configs == [RUNTIMES[0], RUNTIMES[3]]  # the peers are measured against the defaults


# -- the closed-loop simulation (benchmarks/batch_sim.py) -----------------------------------------
def sim_lengths(n: int = 97) -> list[int]:
    return [5 + (k * 37) % 41 for k in range(n)]  # 5..45 tokens, in a fixed scattered order


def test_the_simulated_loop_answers_each_text_once_and_keeps_c_in_flight() -> None:
    from benchmarks.batch_sim import Loop, SharedPool

    lengths = sim_lengths()
    for rule in (Loop, SharedPool):
        loop = rule(lengths, lengths, 8, 2, 11)
        out = loop.run(3000)
        answered = len(out.latencies) + 2000  # the warm-up's are dropped
        running = sum(len(b) for _, kind, _, b in loop.events if kind == 1)
        assert answered + running == sum(r for r, _ in out.shapes)  # every batch run was answered
        assert loop.sent - answered == 8  # closed loop: every answer sent the next text
        assert all(lat >= 11 + 5 for lat in out.latencies)  # at least one batch of the shortest
        if rule is Loop:  # a worker holds what waits in its Batcher and what it runs
            for k in range(2):
                waiting = [e[2] for e in loop.batchers[k].by_length]
                runs_ = [it for _, kind, w, b in loop.events if kind == 1 and w == k for it in b]
                assert loop.held[k] == sum(loop.estimate[it.msg_id] + 8 for it in waiting + runs_)


def test_one_worker_shares_its_pool_with_no_one() -> None:
    """With one worker, one pool of all waiting texts is the worker's own Batcher."""
    from benchmarks.batch_sim import Loop, SharedPool

    lengths = sim_lengths()
    alone, shared = (
        Loop(lengths, lengths, 16, 1, 11).run(2500),
        SharedPool(lengths, lengths, 16, 1, 11).run(2500),
    )
    assert alone.shapes == shared.shapes and alone.clock == shared.clock


def test_a_shared_pool_forms_fuller_batches_than_a_pool_a_worker() -> None:
    from benchmarks.batch_sim import Loop, SharedPool

    lengths = sim_lengths()
    apart, shared = (
        Loop(lengths, lengths, 32, 2, 11).run(4000),
        SharedPool(lengths, lengths, 32, 2, 11).run(4000),
    )
    assert shared.rows() > apart.rows() and shared.clock < apart.clock


def test_steal_is_the_share_of_the_spans_between_readings_only() -> None:
    # (stolen, total) readings: a to b and c to d count, b to c (the served run) does not
    assert steal_pct((10, 100), (20, 200), (90, 900), (90, 1000)) == 5.0
    assert steal_pct((5, 50), (5, 50)) != steal_pct((5, 50), (5, 50))  # nothing elapsed: nan
    stolen, total = cpu_jiffies()
    assert 0 <= stolen <= total


def test_a_ceiling_draw_runs_as_long_as_a_served_draw_unless_told() -> None:
    args, _ = options(["--seconds", "4"])
    assert args.ceiling_seconds == 4.0
    args, _ = options(["--seconds", "4", "--ceiling-seconds", "1.5"])
    assert args.ceiling_seconds == 1.5


# -- the benchmarks' closed loop (devkit/load.py run_load) ----------------------------------------
def test_the_closed_loop_reads_split_answers_reconnects_and_counts_breaks() -> None:
    """Against a stub HTTP server on 127.0.0.1 (the load generator is what is tested): answers
    that arrive in pieces and a `connection: close` answer are each counted once, and the loop
    goes on over a new connection, opened only when a request is to go."""
    import asyncio

    from devkit.load import run_load

    connections = 0

    async def stub(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        n = 0
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            n += 1
            body = b'{"label":"positive"}'
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d"
            if n == 3:  # the third answer on a connection closes it
                head = head.replace(b"200 OK", b"503 Service Unavailable")
                writer.write(head % len(body) + b"\r\nConnection: close\r\n\r\n" + body)
                await writer.drain()
                break
            whole = head % len(body) + b"\r\n\r\n" + body
            for i in range(0, len(whole), 7):  # in pieces, each its own write
                writer.write(whole[i : i + 7])
                await writer.drain()
        writer.close()

    async def go() -> tuple[dict[int, int], int]:
        server = await asyncio.start_server(stub, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            result = await run_load(port, [b"GET / HTTP/1.1\r\n\r\n"], 2, 30.0, 12, warmup_s=0)
        return dict(result.codes), len(result.latencies_ms)

    codes, latencies = asyncio.run(go())
    assert codes == {200: 8, 503: 4}  # 12 requests: two 200s then a closing 503, four times
    assert latencies == 8  # a latency for each 200 only
    assert connections == 4  # a new one after each close, none after the last request


def test_the_closed_loop_counts_a_garbled_answer_and_a_cut_connection_as_failed() -> None:
    import asyncio

    from devkit.load import run_load

    seen = 0

    async def stub(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal seen
        await reader.readuntil(b"\r\n\r\n")
        seen += 1
        if seen == 1:
            writer.write(b"HTTP/1.1 2x0 Garbled\r\nContent-Length: 0\r\n\r\n")
        elif seen == 2:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n{")  # then cut
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    async def go() -> dict[int, int]:
        server = await asyncio.start_server(stub, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            result = await run_load(port, [b"GET / HTTP/1.1\r\n\r\n"], 1, 30.0, 3, warmup_s=0)
        return dict(result.codes)

    assert asyncio.run(go()) == {0: 2, 200: 1}
