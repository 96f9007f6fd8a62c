/* cellar.transfer._copyv: many memmoves in one call, with the GIL released once, and the
 * cutting of a copy job into those calls' tables.
 *
 * Why: a scatter-gather batch of SGLang's layer_first pages is thousands of 64 KiB parts. One
 * ctypes.memmove per part costs ~1.7 us of call overhead and a GIL release and re-acquire each,
 * on which the shm transport's two copy threads then take turns (4096 x 64 KiB: 33 ms on two
 * threads against 23 ms for the same bytes in 2 MiB pieces, measured here). This copies a
 * whole run of pieces per call. Optional: memcopy falls back to ctypes.memmove without it.
 *
 * copy_pieces(table): `table` is a buffer of int64 triples (dst address, src address, bytes).
 * The caller guarantees every range lies inside memory it holds (memcopy checks the views).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *copy_pieces(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer table;
    if (PyObject_GetBuffer(arg, &table, PyBUF_SIMPLE) < 0)
        return NULL;
    if (table.len % (Py_ssize_t)(3 * sizeof(int64_t)) != 0) {
        PyBuffer_Release(&table);
        PyErr_SetString(PyExc_ValueError, "copy_pieces: the table is not int64 triples");
        return NULL;
    }
    const int64_t *t = (const int64_t *)table.buf;
    Py_ssize_t count = table.len / (Py_ssize_t)(3 * sizeof(int64_t));
    for (Py_ssize_t i = 0; i < count; i++) {
        if (t[3 * i + 2] < 0) {
            PyBuffer_Release(&table);
            PyErr_SetString(PyExc_ValueError, "copy_pieces: a negative length");
            return NULL;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++)
        memmove((void *)(intptr_t)t[3 * i], (const void *)(intptr_t)t[3 * i + 1],
                (size_t)t[3 * i + 2]);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&table);
    Py_RETURN_NONE;
}

/* Append one run (its table as bytes, the hash mark, its bytes) to `out`. */
static int emit_run(PyObject *out, const int64_t *tab, Py_ssize_t len, long long mark,
                    long long nbytes) {
    PyObject *table = PyBytes_FromStringAndSize((const char *)tab,
                                                len * (Py_ssize_t)sizeof(int64_t));
    if (table == NULL)
        return -1;
    PyObject *run = Py_BuildValue("(NLL)", table, mark, nbytes);
    if (run == NULL)
        return -1;
    int rc = PyList_Append(out, run);
    Py_DECREF(run);
    return rc;
}

/* cut_runs(views, span_address, to_span, step, hashed) -> (runs, total bytes)
 *
 * memcopy._runs in C (same result, same order): the copies between `views` (buffers, in
 * order) and the contiguous span at `span_address`, cut into runs of exactly `step` bytes
 * (the last one shorter); each run is (int64 triples as bytes, span offset to hash up to
 * after it or -1, bytes). A layer_first batch is thousands of parts: in Python this cost
 * ~0.8 us per part, on the thread that then copies. */
static PyObject *cut_runs(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *views;
    long long seg, step;
    int to_span, hashed;
    if (!PyArg_ParseTuple(args, "OLpLp", &views, &seg, &to_span, &step, &hashed))
        return NULL;
    if (step <= 0) {
        PyErr_SetString(PyExc_ValueError, "cut_runs: step must be positive");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(views, "cut_runs: views must be a sequence");
    if (seq == NULL)
        return NULL;
    PyObject *out = PyList_New(0);
    int64_t *tab = NULL;
    Py_ssize_t len = 0, cap = 0;
    long long pos = 0, run = 0;
    if (out == NULL)
        goto fail;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_buffer b;
        if (PyObject_GetBuffer(items[i], &b, PyBUF_SIMPLE) < 0)
            goto fail;
        long long a = (long long)(intptr_t)b.buf, size = (long long)b.len, off = 0;
        PyBuffer_Release(&b);  /* the caller holds the views: their memory stays */
        while (off < size) {
            long long m = step - run < size - off ? step - run : size - off;
            if (len + 3 > cap) {
                Py_ssize_t grown = cap ? cap * 2 : 96;
                int64_t *bigger = PyMem_Realloc(tab, (size_t)grown * sizeof(int64_t));
                if (bigger == NULL) {
                    PyErr_NoMemory();
                    goto fail;
                }
                tab = bigger;
                cap = grown;
            }
            tab[len++] = to_span ? seg + pos : a + off;
            tab[len++] = to_span ? a + off : seg + pos;
            tab[len++] = m;
            pos += m;
            off += m;
            run += m;
            if (run == step) {
                if (emit_run(out, tab, len, hashed ? pos : -1, run) < 0)
                    goto fail;
                len = 0;
                run = 0;
            }
        }
    }
    if (run && emit_run(out, tab, len, hashed ? pos : -1, run) < 0)
        goto fail;
    PyMem_Free(tab);
    Py_DECREF(seq);
    return Py_BuildValue("(NL)", out, pos);
fail:
    PyMem_Free(tab);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef methods[] = {
    {"cut_runs", cut_runs, METH_VARARGS,
     "cut_runs(views, span_address, to_span, step, hashed) -> (runs, total bytes)."},
    {"copy_pieces", copy_pieces, METH_O,
     "copy_pieces(table): memmove each (dst, src, bytes) int64 triple, GIL released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_copyv", NULL, -1, methods};

PyMODINIT_FUNC PyInit__copyv(void) { return PyModule_Create(&module); }
