"""The one place that declares every structure shared between the front-end and its workers.

Ring segment (one per direction per worker):

    offset 0     header line: magic u64, version u64, slot_size u64, slot_count u64
    offset 64    tail: free-running count of slots published (written by the producer only)
    offset 128   head: free-running count of slots released (written by the consumer only)
    offset 192   slots: slot_count x slot_size bytes

A message occupies one or more consecutive slots and always lies contiguously in memory: when it
would run past the last slot, the producer fills the rest of the ring with one PAD record and
starts the message at slot 0. Each record starts with the record header below.

Control block segment (one per worker): CONTROL_WORDS native int64 words, named by the CTL_*
indices below; the heartbeat sits on a cache line of its own, and words CTL_MODEL_RSS.. hold
one word per model index (the bytes that model added to the worker's RSS). All of it is
written by the worker; the front-end only reads (one writer per word).

All integers inside payloads are little-endian (the wire contract's order); the counters are
native int64 (x86-64: little-endian too) because they are stored through memoryview.cast("q").
"""

from __future__ import annotations

import struct

MAGIC_RING = 0x52494E4753525631  # "RINGSRV1"
MAGIC_CONTROL = 0x52494E4743544C31  # "RINGCTL1"
VERSION = 2  # 2: a request's options and model ride in its record's meta word

CACHE_LINE = 64  # each counter on a line of its own: one writer a line, no false sharing
RING_HEADER = struct.Struct("<QQQQ")  # magic, version, slot_size, slot_count
TAIL_OFFSET = CACHE_LINE
HEAD_OFFSET = 2 * CACHE_LINE
SLOTS_OFFSET = 3 * CACHE_LINE

# Record header at the start of a message's first slot:
#   msg_id u64 | aux i64 | length u32 | flags u32 | nslots u32 | meta u32
# flags is the ring's own (FLAG_PAD); meta is the message's: a request's options byte and model
# index (request_meta), 0 on a response.
RECORD = struct.Struct("<QqIIII")
RECORD_SIZE = RECORD.size  # 32
FLAG_PAD = 1  # filler up to the end of the ring; skip it

REQUEST_SLOT_SIZE = 256  # most sentences fit in one slot; long texts span several
RESPONSE_SLOT_SIZE = 64  # header + a two-label answer in one slot

# Request payload: the UTF-8 text, or for a pair text | PAIR_SEPARATOR | text_pair (0xFF never
# occurs in UTF-8, so a single text cannot be mistaken for a pair): the text alone, written once
# into the ring as the protocol read it. aux = deadline, CLOCK_MONOTONIC ns (0 = none).
# meta = options byte | model index << 16 (request_meta): how a long text is handled (none of
# OPT_MODE: the server's --long-text), whether to answer the vector, whether it is bulk, and
# which model serves it (0: the first, the only one of a one-model server).
PAIR_SEPARATOR = b"\xff"
OPT_CUT = 1  # truncate: true
OPT_REFUSE = 2  # truncate: false
OPT_MODE = 3  # the bits above; neither set: the server's --long-text
OPT_LEFT = 4  # truncation_direction: left (keep the end)
OPT_EMBED = 8  # answer the text's embedding (D floats), not its scores (an embed model only)
OPT_BULK = 16  # a bulk text: the worker batches interactive texts first (service/engine/tenants.py)
OPT_BOTH = 32  # answer the scores and the embedding of one forward pass (a model with both)
OPT_TOKENS = 64  # answer the text's token vectors (TEI's /embed_all; an ONNX embed graph only)
# With OPT_TOKENS, to a multivector (ColBERT) model: the text is a query (its prefix token and
# [MASK] expansion), not a document (workers/process/multivector.py).
OPT_QUERY = 128
# Response payload (24 bytes, so a two-label answer still fits one 64-byte slot):
#   status u8 | bucket u8 | label_id u16 | n u16 | flags u8 | reserved u8 |
#   windows u16 | limit u16 | tokens u32 | queued_us u32 | model_us u32 | n x f32 scores
# flags: RSP_TRUNCATED (the text was cut) and RSP_WINDOWED (scored in `windows` windows), and
# with --precision int8-checked RSP_INT8 or RSP_SECOND_LOOK (the precision that scored it);
# tokens: the text's (or pair's) token count with the special tokens, before any cut. A
# STATUS_TOO_LONG refusal has no scores: `limit` is the model's max_length (truncate: false) or
# --max-windows (RSP_WINDOWED set; `windows` = the windows the text needs, 0 when a pair's first
# text leaves no room for any).
# An embedding answer has the same header with n = D, label_id 0, and the D floats of the vector
# in place of the scores; a message spans as many slots as it needs (the worker checks at load
# that the response ring holds one). An OPT_BOTH answer has n = C + D: the C scores, then the D
# floats of the vector, label_id the scores' argmax (KServe's outputs from one forward pass).
# An OPT_TOKENS answer has RSP_TOKENS in flags, n = H (the hidden size) and `windows` = k, the
# text's tokens after any cut: k x H floats, token by token (the worker refuses a text whose
# vectors would not fit the response ring, STATUS_TOO_LONG with `limit` the tokens that fit).
# A multivector model's answer is the same, its k the tokens it keeps (a document's skiplist
# tokens left out) and H its vectors' dimension D.
# The response record's aux word (unused before) describes the batch that answered the text, for
# the front-end's traces: rows (12 bits) | padded length (12 bits) | the batch's start, the
# forward pass's first moment, in CLOCK_MONOTONIC microseconds modulo 2**40 (12.7 days: the
# front-end reads it back against its own clock, which every process on the host shares, and an
# answer is never that old). Counts past 4095 are clamped. 0: no batch (a refusal).
BATCH_START_BITS = 40
BATCH_FIELD_MAX = 0xFFF
RESPONSE = struct.Struct("<BBHHBBHHIII")
RESPONSE_SIZE = RESPONSE.size  # 24
RSP_TRUNCATED = 1
RSP_WINDOWED = 2
RSP_TOKENS = 4  # the payload is `windows` token vectors of n floats each (OPT_TOKENS)
# A sparse model's answer (workers/process/sparse.py): n term ids (u32, ascending), then their n
# weights (f32); `limit` > 0: the text had more nonzero terms, the heaviest `limit` were kept.
RSP_SPARSE = 8
# --precision int8-checked (workers/runtimes/checked.py): which precision scored the text.
RSP_INT8 = 16  # int8's scores: its margin was at least the threshold
RSP_SECOND_LOOK = 32  # fp32's scores: int8's margin was under the threshold (a windowed text:
# under it in at least one of its windows)
# A token classifier's answer (workers/token_entities.py pack): n = C labels, `windows` the
# windows it was read in; the body holds each window's real tokens: their offsets, subword marks
# and C probabilities. On a STATUS_TOO_LONG: the answer would not fit the response ring, `tokens`
# its real tokens and `limit` the most that fit.
RSP_TOKEN_LABELS = 128

STATUS_OK = 0
STATUS_BAD_REQUEST = 1
STATUS_OVERLOADED = 2
STATUS_DEADLINE = 3
STATUS_INTERNAL = 4
STATUS_UNKNOWN_MODEL = 5  # a model not loaded (or unloaded): HTTP 404, binary status 5
STATUS_RATE_LIMITED = 6  # front-end only: over the key's rate (HTTP 429)
STATUS_TOO_LONG = 7  # worker-side only: HTTP 413; the binary protocol answers it as status 1
STATUS_CANCELLED = 8  # front-end only: its client left before a worker took it (counted 499)


def pack_response(
    status: int,
    bucket: int = 0,
    label_id: int = 0,
    n: int = 0,
    queued_us: int = 0,
    model_us: int = 0,
    flags: int = 0,
    windows: int = 0,
    tokens: int = 0,
    limit: int = 0,
) -> bytes:
    """A response header (the scores follow it); counts past a field's width are clamped."""
    return RESPONSE.pack(
        status,
        bucket,
        label_id,
        n,
        flags,
        0,
        min(windows, 0xFFFF),
        min(limit, 0xFFFF),
        min(tokens, 0xFFFFFFFF),
        min(queued_us, 0xFFFFFFFF),
        min(model_us, 0xFFFFFFFF),
    )


# What a worker may answer (STATUS_RATE_LIMITED is the front-end's alone).
WORKER_STATUSES = frozenset(
    (
        STATUS_OK,
        STATUS_BAD_REQUEST,
        STATUS_OVERLOADED,
        STATUS_DEADLINE,
        STATUS_INTERNAL,
        STATUS_UNKNOWN_MODEL,
        STATUS_TOO_LONG,
    )
)
RSP_KNOWN_FLAGS = (
    RSP_TRUNCATED
    | RSP_WINDOWED
    | RSP_TOKENS
    | RSP_SPARSE
    | RSP_INT8
    | RSP_SECOND_LOOK
    | RSP_TOKEN_LABELS
)


def response_problem(payload: bytes | memoryview) -> str | None:
    """What is wrong with a response payload as a worker wrote it (None: it is well formed):
    its header whole, a status a worker may give, known flags, and exactly the floats its
    header counts (n, or n x windows token vectors), with label_id one of them. The front-end
    reads nothing of an answer before this says yes (a worker that lies is replaced)."""
    if len(payload) < RESPONSE_SIZE:
        return f"a response of {len(payload)} bytes, under its {RESPONSE_SIZE}-byte header"
    status, _bucket, label, n, flags, _r, windows, _limit, _tokens, _q, _m = RESPONSE.unpack_from(
        payload
    )
    if status not in WORKER_STATUSES:
        return f"unknown status {status}"
    if flags & ~RSP_KNOWN_FLAGS:  # a new kind of answer is added to RSP_KNOWN_FLAGS first
        return f"unknown flags {flags:#x} (RSP_KNOWN_FLAGS lists {RSP_KNOWN_FLAGS:#x})"
    if status != STATUS_OK:
        return None
    if flags & RSP_TOKEN_LABELS:  # its own body, read whole by workers/token_entities.py
        return None
    floats = n * windows if flags & RSP_TOKENS else n
    floats = 2 * n if flags & RSP_SPARSE else floats  # n term ids (u32), then n weights
    if len(payload) != RESPONSE_SIZE + 4 * floats:
        return f"{len(payload)} bytes for a header and {floats} floats"
    if label and label >= n and not flags & RSP_SPARSE:
        return f"label_id {label} of {n} scores"
    return None


MAX_MODELS = 64  # model indexes 0..MAX_MODELS-1 (a worker's control block has a word for each)
META_MODEL_SHIFT = 16  # meta: the options byte in bits 0-7, the model index in bits 16-31


def request_meta(options: int, model: int) -> int:
    """A request record's meta word: its options byte (OPT_*) and its model's wire index."""
    return (options & 0xFF) | (model << META_MODEL_SHIFT)


def split_meta(meta: int) -> tuple[int, int]:
    """(options byte, model index) of a request's meta word: the inverse of request_meta."""
    return meta & 0xFF, meta >> META_MODEL_SHIFT


def pack_batch(rows: int, padded_length: int, start_ns: int) -> int:
    """The aux word of an answer from a batch of `rows` padded to `padded_length`, whose
    forward began at `start_ns` (monotonic); a signed int64, as the record stores it."""
    start_us = (start_ns // 1000) & ((1 << BATCH_START_BITS) - 1)
    word = (min(rows, BATCH_FIELD_MAX) << 52) | (min(padded_length, BATCH_FIELD_MAX) << 40)
    word |= start_us
    return word - (1 << 64) if word >= 1 << 63 else word


def unpack_batch(aux: int, now_ns: int) -> tuple[int, int, int]:
    """(rows, padded length, start in monotonic ns) of pack_batch's word, read at `now_ns`
    (after the batch began); (0, 0, 0) for no batch."""
    if not aux:
        return 0, 0, 0
    word = aux & ((1 << 64) - 1)
    mask = (1 << BATCH_START_BITS) - 1
    now_us = now_ns // 1000
    start_us = now_us - ((now_us - (word & mask)) & mask)
    return word >> 52, (word >> 40) & BATCH_FIELD_MAX, start_us * 1000


def ring_bytes(slot_size: int, slot_count: int) -> int:
    return SLOTS_OFFSET + slot_size * slot_count


def slots_for(payload_len: int, slot_size: int) -> int:
    return -(-(RECORD_SIZE + payload_len) // slot_size)


# Control block words. Worker states (CTL_STATE):
W_STARTING = 1  # spawned, loading torch and the model
W_READY = 2  # loaded and warmed, serving-capable
W_DEGRADED = 3  # serving from the CPU fallback after a CUDA out-of-memory error
W_EXITING = 4  # leaving its loop

CONTROL_FIELDS = (
    "magic",
    "version",
    "pid",
    "state",
    "requests",  # answers written
    "batches",
    "tokens",  # real tokens run through the model
    "padded_tokens",  # tokens including padding
    "busy_ns",  # time inside the model
    "expired",  # requests skipped because their deadline had passed
    "bad_requests",
    "fallbacks",  # batches re-run on the CPU copy after CUDA OOM
    "device_kind",  # 0 cpu, 1 cuda
    "gpu_index",
    "gpu_mem_used",
    "gpu_mem_total",
    "gpu_util_milli",
    "gpu_temp_c",
    "gpu_power_mw",
    "cuda_reserved",
    "cuda_allocated",
    "boot_ms",
    "graphs",  # CUDA graphs captured
    "graph_bytes",  # the graphs' shared memory pool, measured after every capture
    "graphs_expected",  # graphs a CUDA worker should have captured
    "capture_error",  # 0 none; 1 out of memory; 2 another error: the worker runs eagerly
    "rows",  # rows run through the model: a text's windows count one each
    "unknown_model",  # requests for a model index this worker does not hold (STATUS_UNKNOWN_MODEL)
)
CTL = {name: i for i, name in enumerate(CONTROL_FIELDS)}
# Batch-size histogram: counts of batches with size <= BATCH_BOUNDS[i].
BATCH_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CTL_BATCH_HIST = 32
CTL_HEARTBEAT = 48  # own cache line (words 48..55)
# Memory per model: word CTL_MODEL_RSS + i holds the bytes model index i added to the worker's
# resident set when it loaded (its weights as the zygote measured them, when it preloaded them,
# plus the worker's own delta: tokenizer, runner, warm-up); 0 for an index the worker does not
# hold. Written once, before the worker reports W_READY.
CTL_MODEL_RSS = 64
CONTROL_WORDS = CTL_MODEL_RSS + MAX_MODELS
CONTROL_BYTES = CONTROL_WORDS * 8

assert len(CONTROL_FIELDS) <= CTL_BATCH_HIST
assert CTL_BATCH_HIST + len(BATCH_BOUNDS) <= CTL_HEARTBEAT
assert CTL_HEARTBEAT + 8 <= CTL_MODEL_RSS
