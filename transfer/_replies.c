/* cellar.transfer._replies: receive a run of READ replies on one connection, GIL released.
 *
 * Why: a TCP get of many small objects spends most of the client's CPU per key in the Python
 * of its receive loop (the reply header into the inbox with the payload's start behind it,
 * the header's checks, the rest of the payload, the bookkeeping): about as much as the kernel
 * spends copying a 64 KiB payload. This does that loop for a run of replies in one call, with
 * exactly the checks `tcp_plan.check_response` makes for an OK read reply. Optional: without
 * it the transport receives every reply in Python (the same bytes and results).
 *
 * read_replies(fd, inbox, start, end, items, deadline_ns, max_bytes)
 *     -> (done, start, end, code, errno)
 *   fd: a plain (not TLS) blocking socket whose kernel timeouts bound each recv.
 *   inbox: the connection's receive buffer (writable); its unread bytes are [start, end).
 *   items: a list of (request id, writable destination) in the order the replies are due.
 *   deadline_ns: CLOCK_MONOTONIC ns; checked before each reply (time.monotonic's clock).
 *   max_bytes: stop once this many payload bytes landed (the caller then hashes them while
 *   they are still in the CPU's cache).
 *   done: how many items got their reply (OK, from the expected id, exactly the item's size).
 *   A reply that is anything else stops the run before it: its header stays unread in the
 *   inbox, followed by any bytes of what came behind it, as the Python loop expects them (the
 *   destination's bytes that were not payload are zeroed). code: 0 stopped as asked or at such
 *   a reply, 1 the deadline passed, 2 the peer closed the stream, 3 a recv failed (errno).
 *   After 1-3 the stream is out of step; the caller drops the connection.
 * A recv interrupted by a signal is retried here (the GIL is released, so no handler can run):
 * a KeyboardInterrupt lands once the run ends, which the socket's kernel timeouts bound.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

/* frame.RESPONSE: <4sBBHIQQ (magic, version, status, flags, msg_len, request_id, length) */
#define RESPONSE_BYTES 28
#define MAX_ITEMS 4096

enum { CODE_OK = 0, CODE_DEADLINE = 1, CODE_CLOSED = 2, CODE_ERRNO = 3 };

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t rd64(const unsigned char *p) { return (uint64_t)rd32(p) | ((uint64_t)rd32(p + 4) << 32); }

typedef struct {
    unsigned char *buf;
    Py_ssize_t size, start, end;
} Inbox;

typedef struct {
    int fd;
    int err;
} Sock;

/* One recvmsg, retried on EINTR: bytes received, 0 at EOF, -1 with errno set. */
static ssize_t recv_iov(Sock *s, struct iovec *iov, int n, int flags) {
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = iov;
    msg.msg_iovlen = (size_t)n;
    for (;;) {
        ssize_t got = recvmsg(s->fd, &msg, flags);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            s->err = errno;
        return got;
    }
}

/* Make room for `n` bytes from `start` (Inbox._make_room). */
static void make_room(Inbox *in, Py_ssize_t n) {
    Py_ssize_t have = in->end - in->start;
    if (have == 0) {
        in->start = in->end = 0;
    } else if (in->size - in->start < n) {
        memmove(in->buf, in->buf + in->start, (size_t)have);
        in->start = 0;
        in->end = have;
    }
}

/* The header buffered at `start`, with up to `cap` bytes behind it straight into dst (their
 * count in *early): Inbox.take_scatter without taking. Returns a CODE_. */
static int header_scatter(Sock *s, Inbox *in, unsigned char *dst, Py_ssize_t cap,
                          Py_ssize_t *early) {
    *early = 0;
    if (in->end - in->start >= RESPONSE_BYTES)
        return CODE_OK;
    make_room(in, RESPONSE_BYTES);
    while (in->end - in->start < RESPONSE_BYTES) {
        Py_ssize_t hdr_end = in->start + RESPONSE_BYTES;
        struct iovec iov[2] = {{in->buf + in->end, (size_t)(hdr_end - in->end)},
                               {dst, (size_t)cap}};
        ssize_t got = recv_iov(s, iov, cap > 0 ? 2 : 1, 0);
        if (got == 0)
            return CODE_CLOSED;
        if (got < 0)
            return CODE_ERRNO;
        Py_ssize_t into_header = got < hdr_end - in->end ? (Py_ssize_t)got : hdr_end - in->end;
        in->end += into_header;
        *early = (Py_ssize_t)got - into_header;
    }
    return CODE_OK;
}

/* The rest of a payload: buffered bytes first, then straight from the socket (WAITALL). */
static int payload_rest(Sock *s, Inbox *in, unsigned char *dst, Py_ssize_t len, Py_ssize_t pos) {
    Py_ssize_t have = in->end - in->start;
    if (have > 0 && pos < len) {
        Py_ssize_t k = have < len - pos ? have : len - pos;
        memcpy(dst + pos, in->buf + in->start, (size_t)k);
        in->start += k;
        pos += k;
    }
    while (pos < len) {
        struct iovec iov = {dst + pos, (size_t)(len - pos)};
        ssize_t got = recv_iov(s, &iov, 1, MSG_WAITALL);
        if (got == 0)
            return CODE_CLOSED;
        if (got < 0)
            return CODE_ERRNO;
        pos += got;
    }
    return CODE_OK;
}

/* Whether the header at `start` is the OK reply of request `rid` carrying exactly `len`
 * bytes (tcp_plan.check_response, for an OK read, with no message). */
static int accepted(const unsigned char *h, uint64_t rid, Py_ssize_t len) {
    return memcmp(h, "CLRP", 4) == 0 && h[4] == 1 && h[5] == 0 && rd32(h + 8) == 0 &&
           rd64(h + 12) == rid && rd64(h + 20) == (uint64_t)len;
}

static int run(Sock *s, Inbox *in, Py_ssize_t count, const uint64_t *rids, Py_buffer *dsts,
               int64_t deadline_ns, Py_ssize_t max_bytes, Py_ssize_t *done) {
    Py_ssize_t landed = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (now_ns() > deadline_ns)
            return CODE_DEADLINE;
        unsigned char *dst = (unsigned char *)dsts[i].buf;
        Py_ssize_t len = dsts[i].len, early = 0;
        /* at most what could be handed back behind the header if it is not accepted */
        Py_ssize_t cap = len < in->size - RESPONSE_BYTES ? len : in->size - RESPONSE_BYTES;
        int code = header_scatter(s, in, dst, cap, &early);
        if (code != CODE_OK)
            return code;
        if (!accepted(in->buf + in->start, rids[i], len)) {
            if (early) { /* not payload: back into the inbox behind the header */
                make_room(in, RESPONSE_BYTES + early);
                memcpy(in->buf + in->end, dst, (size_t)early);
                in->end += early;
                memset(dst, 0, (size_t)early);
            }
            return CODE_OK;
        }
        in->start += RESPONSE_BYTES;
        code = payload_rest(s, in, dst, len, early);
        if (code != CODE_OK)
            return code;
        *done = i + 1;
        landed += len;
        if (landed >= max_bytes)
            return CODE_OK;
    }
    return CODE_OK;
}

static PyObject *read_replies(PyObject *self, PyObject *args) {
    (void)self;
    int fd;
    PyObject *inbox_obj, *items;
    Py_ssize_t start, end, max_bytes;
    long long deadline_ns;
    if (!PyArg_ParseTuple(args, "iOnnO!Ln", &fd, &inbox_obj, &start, &end, &PyList_Type, &items,
                          &deadline_ns, &max_bytes))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(items);
    if (fd < 0 || count > MAX_ITEMS || max_bytes < 0) {
        PyErr_SetString(PyExc_ValueError, "read_replies: bad fd, item count or max_bytes");
        return NULL;
    }
    Py_buffer inbox;
    if (PyObject_GetBuffer(inbox_obj, &inbox, PyBUF_WRITABLE) < 0)
        return NULL;
    if (inbox.len < 2 * RESPONSE_BYTES || start < 0 || start > end || end > inbox.len) {
        PyBuffer_Release(&inbox);
        PyErr_SetString(PyExc_ValueError, "read_replies: the inbox bounds do not fit");
        return NULL;
    }
    uint64_t *rids = PyMem_Malloc((size_t)(count ? count : 1) * sizeof(uint64_t));
    Py_buffer *dsts = PyMem_Calloc((size_t)(count ? count : 1), sizeof(Py_buffer));
    Py_ssize_t held = 0;
    PyObject *result = NULL;
    if (rids == NULL || dsts == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (; held < count; held++) {
        PyObject *item = PyList_GET_ITEM(items, held);
        PyObject *rid_obj, *dst_obj;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "read_replies: items are (request id, buffer)");
            goto out;
        }
        rid_obj = PyTuple_GET_ITEM(item, 0);
        dst_obj = PyTuple_GET_ITEM(item, 1);
        rids[held] = PyLong_AsUnsignedLongLong(rid_obj);
        if (PyErr_Occurred())
            goto out;
        if (PyObject_GetBuffer(dst_obj, &dsts[held], PyBUF_WRITABLE) < 0)
            goto out;
    }
    Inbox in = {(unsigned char *)inbox.buf, inbox.len, start, end};
    Sock s = {fd, 0};
    Py_ssize_t done = 0;
    int code;
    Py_BEGIN_ALLOW_THREADS
    code = run(&s, &in, count, rids, dsts, (int64_t)deadline_ns, max_bytes, &done);
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(nnnii)", done, in.start, in.end, code, s.err);
out:
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&dsts[i]);
    PyMem_Free(dsts);
    PyMem_Free(rids);
    PyBuffer_Release(&inbox);
    return result;
}

static PyMethodDef methods[] = {
    {"read_replies", read_replies, METH_VARARGS,
     "read_replies(fd, inbox, start, end, items, deadline_ns, max_bytes) -> "
     "(done, start, end, code, errno): receive a run of OK READ replies, GIL released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_replies", NULL, -1, methods};

PyMODINIT_FUNC PyInit__replies(void) { return PyModule_Create(&module); }
