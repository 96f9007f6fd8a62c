/* cellar.transfer._spin: poll one socket for a reply with the GIL released.
 *
 * Why: spinning in Python (poll(0) in a loop) holds the GIL between polls, so the process's
 * other threads (a put's hasher behind PutStart, the unpin flusher, other callers) get it only
 * in the gaps of a syscall; a thread that waits for the GIL and finds it taken again each time
 * waits for CPython's switch interval (5 ms) before it forces a hand-off. Here the whole
 * window runs without the GIL. Optional: without it spin_wait.py does not spin (it blocks at
 * once, as with CELLAR_SPIN_US=0).
 *
 * spin(fd, window_ns) -> bool: True once `fd` is readable (or has an error or hang-up the
 * caller's read will report), False when the window ended first. Between polls it yields the
 * CPU (a server the kernel woke onto this CPU runs at once). It reads nothing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>

#define MAX_WINDOW_NS 10000000LL /* 10 ms, as spin_wait.MAX_SPIN_US */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static PyObject *spin(PyObject *self, PyObject *args) {
    (void)self;
    int fd;
    long long window_ns;
    if (!PyArg_ParseTuple(args, "iL", &fd, &window_ns))
        return NULL;
    if (fd < 0 || window_ns < 0 || window_ns > MAX_WINDOW_NS) {
        PyErr_SetString(PyExc_ValueError, "spin: fd must be >= 0 and window_ns in 0..10^7");
        return NULL;
    }
    int ready = 0;
    Py_BEGIN_ALLOW_THREADS
    struct pollfd p = {fd, POLLIN, 0};
    int64_t end = now_ns() + window_ns;
    for (;;) {
        p.revents = 0;
        if (poll(&p, 1, 0) != 0) { /* readable, or an error the read will report */
            ready = 1;
            break;
        }
        if (now_ns() >= end)
            break;
        sched_yield();
    }
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(ready);
}

static PyMethodDef methods[] = {
    {"spin", spin, METH_VARARGS,
     "spin(fd, window_ns) -> bool: poll fd until readable or the window ends, GIL released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_spin", NULL, -1, methods};

PyMODINIT_FUNC PyInit__spin(void) { return PyModule_Create(&module); }
