/* The receive hot path of a worker connection: HTTP/2 frames cut from the read buffer, and Generate's
 * streamed chunks decoded, without a Python-level loop or object per field (h2_frames.py, vllm_grpc.py).
 *
 * Both functions do only the common case and hand everything else back, so the Python code around them
 * keeps every rule of HTTP/2, gRPC and protobuf in one place:
 *
 * frames(buf, max_frame, max_message, frame_type) -> (consumed, items)
 *     Every whole frame at the start of ``buf``, in order, until an incomplete one or one longer than
 *     ``max_frame`` (left for the caller, which raises). A DATA frame without flags whose payload is exactly
 *     one uncompressed gRPC message of at most ``max_message`` bytes (a streamed token's frame) becomes
 *     ``(stream_id, message)``; every other frame a ``frame_type`` (h2_frames.Frame) with its raw payload.
 *
 * chunks(batch, output_type, merge) -> list | None
 *     The serialized GenerateResponses of ``batch`` as ``output_type`` (workers.types.WorkerOutput) tuples,
 *     if every one is a plain streamed chunk: only the ``chunk`` member, once, holding nothing but token ids
 *     and the uint32 counts and index, each value within 32 bits. Otherwise None, and the caller parses the
 *     batch with protobuf (logprobs, the final message, unknown fields, anything malformed: protobuf decides).
 *     With ``merge`` and three or more messages whose all but last are choice 0, the all-but-last become one
 *     output (their ids; the counts of the last of them; the largest cached count) followed by the last, as
 *     vllm_grpc._merge_run builds them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define HEADER_SIZE 9
#define GRPC_PREFIX 5

/* A tuple subclass instance (a NamedTuple) built as tuple.__new__(cls, items) would build it; steals items. */
static PyObject *new_tuple_of(PyTypeObject *cls, PyObject **items, Py_ssize_t n) {
    PyObject *t = cls->tp_alloc(cls, n);
    if (!t) {
        for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(items[i]);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(t, i, items[i]);
    return t;
}

static int check_tuple_type(PyObject *cls) {
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "expected a tuple subclass");
        return -1;
    }
    return 0;
}

static PyObject *frames(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "frames(buf, max_frame, max_message, frame_type)");
        return NULL;
    }
    Py_ssize_t max_frame = PyLong_AsSsize_t(args[1]);
    Py_ssize_t max_message = PyLong_AsSsize_t(args[2]);
    if ((max_frame == -1 || max_message == -1) && PyErr_Occurred()) return NULL;
    if (check_tuple_type(args[3]) < 0) return NULL;
    PyTypeObject *frame_type = (PyTypeObject *)args[3];
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *b = view.buf;
    Py_ssize_t end = view.len, pos = 0;
    PyObject *items = PyList_New(0);
    if (!items) goto fail;
    while (end - pos >= HEADER_SIZE) {
        const uint8_t *h = b + pos;
        Py_ssize_t length = (Py_ssize_t)h[0] << 16 | (Py_ssize_t)h[1] << 8 | h[2];
        if (length > max_frame || end - pos - HEADER_SIZE < length) break;
        unsigned kind = h[3], flags = h[4];
        long stream_id = (long)(((uint32_t)h[5] << 24 | (uint32_t)h[6] << 16 | (uint32_t)h[7] << 8 | h[8]) &
                                0x7FFFFFFFu);
        const uint8_t *payload = h + HEADER_SIZE;
        PyObject *item;
        if (kind == 0 && flags == 0 && length >= GRPC_PREFIX && payload[0] == 0 &&
            ((Py_ssize_t)payload[1] << 24 | (Py_ssize_t)payload[2] << 16 | (Py_ssize_t)payload[3] << 8 |
             payload[4]) == length - GRPC_PREFIX &&
            length - GRPC_PREFIX <= max_message) {
            PyObject *sid = PyLong_FromLong(stream_id);
            PyObject *msg = PyBytes_FromStringAndSize((const char *)payload + GRPC_PREFIX, length - GRPC_PREFIX);
            if (!sid || !msg) {
                Py_XDECREF(sid);
                Py_XDECREF(msg);
                goto fail;
            }
            item = PyTuple_Pack(2, sid, msg);
            Py_DECREF(sid);
            Py_DECREF(msg);
        } else {
            PyObject *fields[4] = {
                PyLong_FromLong((long)kind),
                PyLong_FromLong((long)flags),
                PyLong_FromLong(stream_id),
                PyBytes_FromStringAndSize((const char *)payload, length),
            };
            if (!fields[0] || !fields[1] || !fields[2] || !fields[3]) {
                for (int i = 0; i < 4; i++) Py_XDECREF(fields[i]);
                goto fail;
            }
            item = new_tuple_of(frame_type, fields, 4);
        }
        if (!item) goto fail;
        int rc = PyList_Append(items, item);
        Py_DECREF(item);
        if (rc < 0) goto fail;
        pos += HEADER_SIZE + length;
    }
    PyBuffer_Release(&view);
    PyObject *result = Py_BuildValue("(nN)", pos, items);
    return result;
fail:
    Py_XDECREF(items);
    PyBuffer_Release(&view);
    return NULL;
}

/* --- Generate chunks ------------------------------------------------------------------------------------ */

/* A varint at *p (< end) into *v; 0 on success, -1 if truncated or longer than 10 bytes. */
static inline int varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    uint64_t result = 0;
    for (int shift = 0; shift < 70 && *p < end; shift += 7) {
        uint8_t byte = *(*p)++;
        result |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *v = result;
            return 0;
        }
    }
    return -1;
}

typedef struct {
    uint32_t prompt, completion, cached, index;
    PyObject *ids; /* list of int */
} Chunk;

/* 1: a plain chunk decoded into *c (c->ids a new list); 0: not one (decline); -1: a Python error. */
static int decode_chunk(const uint8_t *p, Py_ssize_t len, Chunk *c) {
    const uint8_t *end = p + len;
    uint64_t key, n;
    /* GenerateResponse: field 1 (chunk), length-delimited, exactly once and nothing else. */
    if (varint(&p, end, &key) < 0 || key != ((1 << 3) | 2)) return 0;
    if (varint(&p, end, &n) < 0 || n != (uint64_t)(end - p)) return 0;
    memset(c, 0, sizeof *c);
    c->ids = PyList_New(0);
    if (!c->ids) return -1;
    while (p < end) {
        if (varint(&p, end, &key) < 0) goto decline;
        uint64_t field = key >> 3, wire = key & 7;
        if (field == 1 && wire == 2) { /* packed token ids */
            if (varint(&p, end, &n) < 0 || n > (uint64_t)(end - p)) goto decline;
            const uint8_t *stop = p + n;
            while (p < stop) {
                uint64_t v;
                if (varint(&p, stop, &v) < 0 || v > 0xFFFFFFFFu) goto decline;
                PyObject *id = PyLong_FromUnsignedLong((unsigned long)v);
                if (!id) goto error;
                int rc = PyList_Append(c->ids, id);
                Py_DECREF(id);
                if (rc < 0) goto error;
            }
        } else if (wire == 0 && (field == 1 || field == 2 || field == 3 || field == 4 || field == 7)) {
            uint64_t v;
            if (varint(&p, end, &v) < 0 || v > 0xFFFFFFFFu) goto decline;
            switch (field) {
            case 1: {
                PyObject *id = PyLong_FromUnsignedLong((unsigned long)v);
                if (!id) goto error;
                int rc = PyList_Append(c->ids, id);
                Py_DECREF(id);
                if (rc < 0) goto error;
                break;
            }
            case 2: c->prompt = (uint32_t)v; break;
            case 3: c->completion = (uint32_t)v; break;
            case 4: c->cached = (uint32_t)v; break;
            default: c->index = (uint32_t)v; break;
            }
        } else {
            goto decline; /* logprobs, an unknown field, a wire type protobuf would keep as unknown */
        }
    }
    return 1;
decline:
    Py_CLEAR(c->ids);
    return 0;
error:
    Py_CLEAR(c->ids);
    return -1;
}

/* output_type(index, ids, prompt, completion, cached, None, None, None, None); steals ids. */
static PyObject *output_of(PyTypeObject *cls, uint32_t index, PyObject *ids, uint32_t prompt, uint32_t completion,
                           uint32_t cached) {
    PyObject *items[9] = {
        PyLong_FromUnsignedLong(index), ids, PyLong_FromUnsignedLong(prompt), PyLong_FromUnsignedLong(completion),
        PyLong_FromUnsignedLong(cached), Py_NewRef(Py_None), Py_NewRef(Py_None), Py_NewRef(Py_None),
        Py_NewRef(Py_None),
    };
    for (int i = 0; i < 5; i++) {
        if (!items[i]) {
            for (int k = 0; k < 9; k++) Py_XDECREF(items[k]);
            return NULL;
        }
    }
    return new_tuple_of(cls, items, 9);
}

static PyObject *chunks(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "chunks(batch: list[bytes], output_type, merge)");
        return NULL;
    }
    if (check_tuple_type(args[1]) < 0) return NULL;
    PyObject *batch = args[0];
    PyTypeObject *cls = (PyTypeObject *)args[1];
    int merge = PyObject_IsTrue(args[2]);
    if (merge < 0) return NULL;
    Py_ssize_t count = PyList_GET_SIZE(batch);
    if (count == 0) return PyList_New(0);
    Chunk stack[8];
    Chunk *decoded = count <= 8 ? stack : PyMem_Malloc(sizeof(Chunk) * (size_t)count);
    if (!decoded) return PyErr_NoMemory();
    Py_ssize_t done = 0;
    PyObject *result = NULL;
    for (; done < count; done++) {
        PyObject *data = PyList_GET_ITEM(batch, done);
        if (!PyBytes_Check(data)) break;
        int rc = decode_chunk((const uint8_t *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), &decoded[done]);
        if (rc < 0) goto cleanup;
        if (rc == 0) break;
    }
    if (done < count) {
        result = Py_NewRef(Py_None);
        goto cleanup;
    }
    int merged = merge && count >= 3;
    for (Py_ssize_t i = 0; merged && i < count - 1; i++) merged = decoded[i].index == 0;
    result = PyList_New(0);
    if (!result) goto cleanup;
    Py_ssize_t first = 0;
    if (merged) {
        PyObject *ids = decoded[0].ids;
        decoded[0].ids = NULL;
        uint32_t cached = decoded[0].cached;
        for (Py_ssize_t i = 1; i < count - 1; i++) {
            if (PyList_SetSlice(ids, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, decoded[i].ids) < 0) {
                Py_DECREF(ids);
                Py_CLEAR(result);
                goto cleanup;
            }
            if (decoded[i].cached > cached) cached = decoded[i].cached;
        }
        const Chunk *last = &decoded[count - 2];
        PyObject *out = output_of(cls, 0, ids, last->prompt, last->completion, cached);
        if (!out || PyList_Append(result, out) < 0) {
            Py_XDECREF(out);
            Py_CLEAR(result);
            goto cleanup;
        }
        Py_DECREF(out);
        first = count - 1;
    }
    for (Py_ssize_t i = first; i < count; i++) {
        Chunk *c = &decoded[i];
        PyObject *out = output_of(cls, c->index, c->ids, c->prompt, c->completion, c->cached);
        c->ids = NULL; /* stolen, also on failure */
        if (!out || PyList_Append(result, out) < 0) {
            Py_XDECREF(out);
            Py_CLEAR(result);
            goto cleanup;
        }
        Py_DECREF(out);
    }
cleanup:
    for (Py_ssize_t i = 0; i < done && i < count; i++) Py_XDECREF(decoded[i].ids);
    if (decoded != stack) PyMem_Free(decoded);
    return result;
}

static PyMethodDef methods[] = {
    {"frames", (PyCFunction)(void (*)(void))frames, METH_FASTCALL,
     "frames(buf, max_frame, max_message, frame_type) -> (consumed, items): whole frames; a streamed token's "
     "DATA frame as (stream_id, message)"},
    {"chunks", (PyCFunction)(void (*)(void))chunks, METH_FASTCALL,
     "chunks(batch, output_type, merge) -> list | None: plain Generate chunks as outputs, else None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rx", "The worker connection's receive hot path (see the file's comment).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rx(void) { return PyModule_Create(&module); }
