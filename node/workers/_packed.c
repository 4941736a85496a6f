/* A prompt's token ids as the payload of a protobuf packed ``repeated uint32`` field (packed_ids.py).
 *
 * Each id is written as its shortest varint, as protobuf itself writes it, straight from the array's
 * 32-bit items: no Python int per id. Python's big-int fallback spends ~1.7 M instructions per 7,800 ids;
 * this spends a few tens of thousands. Ids must be non-negative (signed items) — None otherwise, and the
 * caller lets protobuf write the field.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static PyObject *packed_uint32(PyObject *module, PyObject *arg) {
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    PyObject *result = NULL;
    const char *format = view.format ? view.format : "B";
    int is_signed = format[0] == 'i' || format[0] == 'l';
    if (view.itemsize != 4 || (format[0] != 'i' && format[0] != 'I' && format[0] != 'l' && format[0] != 'L')) {
        PyErr_SetString(PyExc_TypeError, "ids must be a buffer of 4-byte integers");
        goto done;
    }
    Py_ssize_t count = view.len / 4;
    const uint32_t *ids = view.buf;
    /* 5 bytes is the longest varint of a 32-bit value */
    result = PyBytes_FromStringAndSize(NULL, count * 5);
    if (!result) goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result), *p = out;
    for (Py_ssize_t k = 0; k < count; k++) {
        uint32_t v = ids[k];
        if (is_signed && (v & 0x80000000u)) {
            Py_CLEAR(result);
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
        while (v > 0x7F) {
            *p++ = (uint8_t)(v | 0x80);
            v >>= 7;
        }
        *p++ = (uint8_t)v;
    }
    if (_PyBytes_Resize(&result, p - out) < 0) result = NULL;
done:
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"packed_uint32", packed_uint32, METH_O,
     "packed_uint32(ids) -> bytes | None: shortest varints of 4-byte ids; None if a signed id is negative"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_packed", "Protobuf packed varints of token ids (see packed_ids.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__packed(void) { return PyModule_Create(&module); }
