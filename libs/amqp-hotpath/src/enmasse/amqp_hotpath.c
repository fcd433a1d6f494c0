/*
 * enmasse.amqp_hotpath: the calls into proton-c that the AMQP engine makes for every message.
 *
 * What flows in: raw proton pointers as Python ints (collector, transport, link, delivery), a
 * socket's file descriptor, payload bytes. What flows out: the next event worth a Python
 * handler (a complete transfer with its payload, an outcome, an endpoint change), delivery
 * pointers, byte counts.
 *
 * Why it exists: the engine (enmasse/amqp/engine/) drives proton-c through the cffi
 * binding that python-qpid-proton ships. Each cffi call releases and takes back the GIL and
 * wraps its result in a new cdata object: about 230 ns, and a forwarded message needed 20-25
 * of them, more than all the routing around them. Here the same calls cost a plain C-API call
 * (no GIL hand-off, ints in and out), and the ones that always come together are one call:
 * reading the event collector skips the events no handler wants (transport, local-endpoint
 * ones) without returning to Python; a complete transfer comes back already received and
 * advanced; a send is delivery + send + advance; socket bytes go straight between the socket
 * and proton's own buffers (pn_transport_tail/head), no copy through Python.
 *
 * It holds no state of its own but the table of proton's function addresses, which the engine
 * hands over once with bind() (taken from the cffi binding, so both use the one loaded
 * proton-c and this module needs neither proton's headers nor linking against it). Everything
 * else, routing, lifetimes, errors, stays in Python: see engine.py for the contract.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

/* proton-c's types, opaque here; the signatures are proton 0.40's (the proton headers). */
typedef struct pn_collector_t pn_collector_t;
typedef struct pn_event_t pn_event_t;
typedef struct pn_delivery_t pn_delivery_t;
typedef struct pn_link_t pn_link_t;
typedef struct pn_session_t pn_session_t;
typedef struct pn_connection_t pn_connection_t;
typedef struct pn_transport_t pn_transport_t;
typedef struct {
    size_t size;
    const char *start;
} pn_bytes_t;

/* Event types, delivery states and codes this module acts on (proton/event.h, disposition.h). */
#define PN_DELIVERY 28
#define PN_EOS (-1)
#define PN_ACCEPTED 0x24
#define PN_MODIFIED 0x27
#define TRANSACTIONAL_STATE 0x34 /* amqp:transactional-state:list: an outcome under a transaction */

/* What next_event returns first for the records it builds itself (proton's own event types
 * are positive). */
#define KIND_TRANSFER (-1)
#define KIND_PARTIAL (-2)
#define KIND_OUTCOME (-3)

#define MAX_EVENT_TYPE 128

static struct {
    pn_event_t *(*collector_peek)(pn_collector_t *);
    bool (*collector_pop)(pn_collector_t *);
    int (*event_type)(pn_event_t *);
    pn_delivery_t *(*event_delivery)(pn_event_t *);
    pn_link_t *(*event_link)(pn_event_t *);
    pn_session_t *(*event_session)(pn_event_t *);
    pn_connection_t *(*event_connection)(pn_event_t *);
    pn_link_t *(*delivery_link)(pn_delivery_t *);
    bool (*delivery_readable)(pn_delivery_t *);
    bool (*delivery_partial)(pn_delivery_t *);
    bool (*delivery_aborted)(pn_delivery_t *);
    bool (*delivery_settled)(pn_delivery_t *);
    size_t (*delivery_pending)(pn_delivery_t *);
    uint64_t (*delivery_remote_state)(pn_delivery_t *);
    void (*delivery_update)(pn_delivery_t *, uint64_t);
    void (*delivery_settle)(pn_delivery_t *);
    pn_delivery_t *(*delivery)(pn_link_t *, pn_bytes_t);
    bool (*link_is_sender)(pn_link_t *);
    ssize_t (*link_recv)(pn_link_t *, char *, size_t);
    ssize_t (*link_send)(pn_link_t *, const char *, size_t);
    bool (*link_advance)(pn_link_t *);
    int (*link_credit)(pn_link_t *);
    ssize_t (*transport_capacity)(pn_transport_t *);
    char *(*transport_tail)(pn_transport_t *);
    int (*transport_process)(pn_transport_t *, size_t);
    ssize_t (*transport_pending)(pn_transport_t *);
    const char *(*transport_head)(pn_transport_t *);
    void (*transport_pop)(pn_transport_t *, size_t);
} pn;

static bool bound = false;
static bool wanted_kinds[MAX_EVENT_TYPE];

static const char *const function_names[] = {
    "pn_collector_peek", "pn_collector_pop", "pn_event_type", "pn_event_delivery",
    "pn_event_link", "pn_event_session", "pn_event_connection", "pn_delivery_link",
    "pn_delivery_readable", "pn_delivery_partial", "pn_delivery_aborted",
    "pn_delivery_settled", "pn_delivery_pending", "pn_delivery_remote_state",
    "pn_delivery_update", "pn_delivery_settle", "pn_delivery", "pn_link_is_sender",
    "pn_link_recv", "pn_link_send", "pn_link_advance", "pn_link_credit",
    "pn_transport_capacity", "pn_transport_tail", "pn_transport_process",
    "pn_transport_pending", "pn_transport_head", "pn_transport_pop",
};
#define FUNCTION_COUNT (sizeof(function_names) / sizeof(function_names[0]))

static inline void *as_pointer(PyObject *value) { return PyLong_AsVoidPtr(value); }

static inline PyObject *from_pointer(const void *pointer) {
    return PyLong_FromVoidPtr((void *)pointer);
}

static bool check_args(Py_ssize_t nargs, Py_ssize_t wanted, const char *name) {
    if (!bound) {
        PyErr_SetString(PyExc_RuntimeError, "amqp_hotpath: bind() was not called");
        return false;
    }
    if (nargs != wanted) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, wanted,
                     nargs);
        return false;
    }
    return true;
}

/* bind(addresses: dict[str, int], kinds: Iterable[int]) */
static PyObject *bind_proton(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "bind(addresses: dict[str, int], kinds)");
        return NULL;
    }
    void **slots = (void **)&pn;
    for (size_t i = 0; i < FUNCTION_COUNT; i++) {
        PyObject *address = PyDict_GetItemString(args[0], function_names[i]);
        if (address == NULL) {
            PyErr_Format(PyExc_KeyError, "bind(): no address for %s", function_names[i]);
            return NULL;
        }
        void *pointer = PyLong_AsVoidPtr(address);
        if (pointer == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "bind(): null address for %s", function_names[i]);
            return NULL;
        }
        slots[i] = pointer;
    }
    PyObject *iterator = PyObject_GetIter(args[1]);
    if (iterator == NULL)
        return NULL;
    memset(wanted_kinds, 0, sizeof(wanted_kinds));
    PyObject *item;
    while ((item = PyIter_Next(iterator)) != NULL) {
        long kind = PyLong_AsLong(item);
        Py_DECREF(item);
        if (kind < 0 || kind >= MAX_EVENT_TYPE) {
            Py_DECREF(iterator);
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "bind(): event type %ld out of range", kind);
            return NULL;
        }
        wanted_kinds[kind] = true;
    }
    Py_DECREF(iterator);
    if (PyErr_Occurred())
        return NULL;
    bound = true;
    Py_RETURN_NONE;
}

/* A complete incoming delivery: its bytes, received and the link advanced; pre-settled ones
 * (the peer settled them on sending) settled here too, so the record carries delivery 0. */
static PyObject *transfer_record(pn_link_t *link, pn_delivery_t *delivery) {
    size_t size = pn.delivery_pending(delivery);
    PyObject *payload = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (payload == NULL)
        return NULL;
    if (size > 0) {
        ssize_t got = pn.link_recv(link, PyBytes_AS_STRING(payload), size);
        if (got < 0)
            got = 0;
        if ((size_t)got < size && _PyBytes_Resize(&payload, got) < 0)
            return NULL;
    }
    pn.link_advance(link);
    pn_delivery_t *unsettled = delivery;
    if (pn.delivery_settled(delivery)) {
        pn.delivery_settle(delivery);
        unsettled = NULL;
    }
    PyObject *record = PyTuple_New(4);
    if (record == NULL) {
        Py_DECREF(payload);
        return NULL;
    }
    PyTuple_SET_ITEM(record, 0, PyLong_FromLong(KIND_TRANSFER));
    PyTuple_SET_ITEM(record, 1, from_pointer(link));
    PyTuple_SET_ITEM(record, 2, from_pointer(unsettled));
    PyTuple_SET_ITEM(record, 3, payload);
    return record;
}

/* A delivery event, or NULL with no error when no handler needs it. */
static PyObject *delivery_record(pn_event_t *event) {
    pn_delivery_t *delivery = pn.event_delivery(event);
    pn_link_t *link = pn.delivery_link(delivery);
    if (pn.link_is_sender(link)) {
        uint64_t state = pn.delivery_remote_state(delivery);
        /* A transactional state is passed on unsettled too: its outcome waits for the
         * transaction, which the handler tracks. */
        bool terminal = (state >= PN_ACCEPTED && state <= PN_MODIFIED) ||
                        state == TRANSACTIONAL_STATE;
        if (!terminal && !pn.delivery_settled(delivery))
            return NULL; /* a non-terminal state (received): the outcome comes later */
        return Py_BuildValue("(iNK)", KIND_OUTCOME, from_pointer(delivery),
                             (unsigned long long)state);
    }
    if (!pn.delivery_readable(delivery))
        return NULL;
    if (pn.delivery_aborted(delivery)) {
        /* The sender gave up on it mid-way: drop what arrived of it. */
        pn.delivery_settle(delivery);
        pn.link_advance(link);
        return NULL;
    }
    if (pn.delivery_partial(delivery))
        return Py_BuildValue("(iNn)", KIND_PARTIAL, from_pointer(link),
                             (Py_ssize_t)pn.delivery_pending(delivery));
    return transfer_record(link, delivery);
}

static PyObject *endpoint_record(pn_event_t *event, int kind) {
    const void *object = NULL;
    if (kind >= 0 && kind < MAX_EVENT_TYPE) {
        object = pn.event_link(event);
        if (object == NULL)
            object = pn.event_session(event);
    }
    return Py_BuildValue("(iNN)", kind, from_pointer(pn.event_connection(event)),
                         from_pointer(object));
}

/* next_event(collector) -> record | None
 *   (KIND_TRANSFER, link, delivery or 0, payload)   a complete incoming message
 *   (KIND_PARTIAL, link, bytes so far)               part of a large incoming message
 *   (KIND_OUTCOME, delivery, remote state)           the peer settled a delivery we sent
 *   (event type, connection, link or session or 0)   an endpoint event of a wanted type
 * Each event is popped before its record is returned, so a handler that runs the collector
 * again (an abort inside a callback) never sees it twice. */
static PyObject *next_event(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!check_args(nargs, 1, "next_event"))
        return NULL;
    pn_collector_t *collector = as_pointer(args[0]);
    if (collector == NULL && PyErr_Occurred())
        return NULL;
    pn_event_t *event;
    while ((event = pn.collector_peek(collector)) != NULL) {
        int kind = pn.event_type(event);
        PyObject *record = NULL;
        if (kind == PN_DELIVERY)
            record = delivery_record(event);
        else if (kind >= 0 && kind < MAX_EVENT_TYPE && wanted_kinds[kind])
            record = endpoint_record(event, kind);
        pn.collector_pop(collector);
        if (record != NULL || PyErr_Occurred())
            return record;
    }
    Py_RETURN_NONE;
}

/* send(link, tag: int | bytes, payload, settled: bool) -> delivery (0 when sent settled) */
static PyObject *send_message(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!check_args(nargs, 4, "send"))
        return NULL;
    pn_link_t *link = as_pointer(args[0]);
    if (link == NULL)
        return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "send(): null link");
    char tag_bytes[8];
    pn_bytes_t tag;
    Py_buffer tag_buffer = {0};
    if (PyLong_Check(args[1])) {
        unsigned long long number = PyLong_AsUnsignedLongLong(args[1]);
        if (number == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
        for (int i = 0; i < 8; i++)
            tag_bytes[i] = (char)((number >> (8 * i)) & 0xff);
        tag.size = 8;
        tag.start = tag_bytes;
    } else {
        if (PyObject_GetBuffer(args[1], &tag_buffer, PyBUF_SIMPLE) < 0)
            return NULL;
        tag.size = (size_t)tag_buffer.len;
        tag.start = tag_buffer.buf;
    }
    Py_buffer payload;
    if (PyObject_GetBuffer(args[2], &payload, PyBUF_SIMPLE) < 0) {
        if (tag_buffer.obj != NULL)
            PyBuffer_Release(&tag_buffer);
        return NULL;
    }
    int settled = PyObject_IsTrue(args[3]);
    pn_delivery_t *delivery = pn.delivery(link, tag);
    if (tag_buffer.obj != NULL)
        PyBuffer_Release(&tag_buffer);
    pn.link_send(link, payload.buf, (size_t)payload.len);
    PyBuffer_Release(&payload);
    pn.link_advance(link);
    if (settled) {
        pn.delivery_settle(delivery);
        delivery = NULL;
    }
    return from_pointer(delivery);
}

/* settle(delivery, state) -> None: state 0 settles without a disposition of ours (what
 * pre-settled and outcome-bearing deliveries need); else update to the state, then settle. */
static PyObject *settle(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!check_args(nargs, 2, "settle"))
        return NULL;
    pn_delivery_t *delivery = as_pointer(args[0]);
    if (delivery == NULL)
        return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "settle(): null delivery");
    unsigned long long state = PyLong_AsUnsignedLongLong(args[1]);
    if (state == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (state)
        pn.delivery_update(delivery, state);
    pn.delivery_settle(delivery);
    Py_RETURN_NONE;
}

/* credit(link) -> int */
static PyObject *credit(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!check_args(nargs, 1, "credit"))
        return NULL;
    pn_link_t *link = as_pointer(args[0]);
    if (link == NULL)
        return PyErr_Occurred() ? NULL : PyLong_FromLong(0);
    return PyLong_FromLong(pn.link_credit(link));
}

/* Read statuses: more may come later (the socket is empty, or the per-call bound was hit). */
#define READ_AGAIN 0
#define READ_EOF (-1)
#define READ_INPUT_CLOSED (-2)

/* read(transport, fd, max_reads) -> (bytes read, status): status READ_AGAIN, READ_EOF (the
 * peer closed its side; nothing was pushed after), READ_INPUT_CLOSED (the transport takes no
 * more input: nothing was read) or an errno. Bytes go from the socket straight into proton's
 * input buffer. */
static PyObject *read_socket(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!check_args(nargs, 3, "read"))
        return NULL;
    pn_transport_t *transport = as_pointer(args[0]);
    int fd = PyLong_AsLong(args[1]);
    long max_reads = PyLong_AsLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t total = 0;
    int status = READ_AGAIN;
    for (long i = 0; i < max_reads; i++) {
        ssize_t capacity = pn.transport_capacity(transport);
        if (capacity < 0 && i == 0) {
            status = READ_INPUT_CLOSED;
            break;
        }
        if (capacity <= 0)
            break;
        char *tail = pn.transport_tail(transport);
        ssize_t got;
        int error = 0;
        Py_BEGIN_ALLOW_THREADS
        got = recv(fd, tail, (size_t)capacity, MSG_DONTWAIT);
        if (got < 0)
            error = errno;
        Py_END_ALLOW_THREADS
        if (got < 0) {
            if (error != EAGAIN && error != EWOULDBLOCK && error != EINTR)
                status = error;
            break;
        }
        if (got == 0) {
            status = READ_EOF;
            break;
        }
        pn.transport_process(transport, (size_t)got);
        total += got;
        if (got < capacity)
            break;
    }
    return Py_BuildValue("(ni)", total, status);
}

#define WRITE_DONE 0
#define WRITE_HEAD_CLOSED (-1)
#define WRITE_BLOCKED (-2)

/* write(transport, fd) -> status: WRITE_DONE (proton has nothing more now), WRITE_HEAD_CLOSED
 * (proton wrote its last byte), WRITE_BLOCKED (the socket is full: wait for EPOLLOUT) or an
 * errno. Bytes go from proton's output buffer straight to the socket. */
static PyObject *write_socket(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!check_args(nargs, 2, "write"))
        return NULL;
    pn_transport_t *transport = as_pointer(args[0]);
    int fd = PyLong_AsLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    for (;;) {
        ssize_t pending = pn.transport_pending(transport);
        if (pending < 0)
            return PyLong_FromLong(WRITE_HEAD_CLOSED);
        if (pending == 0)
            return PyLong_FromLong(WRITE_DONE);
        const char *head = pn.transport_head(transport);
        ssize_t sent;
        int error = 0;
        Py_BEGIN_ALLOW_THREADS
        sent = send(fd, head, (size_t)pending, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (sent < 0)
            error = errno;
        Py_END_ALLOW_THREADS
        if (sent < 0) {
            if (error == EAGAIN || error == EWOULDBLOCK || error == EINTR)
                return PyLong_FromLong(WRITE_BLOCKED);
            return PyLong_FromLong(error);
        }
        pn.transport_pop(transport, (size_t)sent);
        if (sent < pending)
            return PyLong_FromLong(WRITE_BLOCKED);
    }
}

static PyMethodDef methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind_proton, METH_FASTCALL,
     "bind(addresses, kinds): proton's function addresses by name, and the endpoint event "
     "types next_event() passes on."},
    {"next_event", (PyCFunction)(void (*)(void))next_event, METH_FASTCALL,
     "next_event(collector) -> record | None"},
    {"send", (PyCFunction)(void (*)(void))send_message, METH_FASTCALL,
     "send(link, tag, payload, settled) -> delivery"},
    {"settle", (PyCFunction)(void (*)(void))settle, METH_FASTCALL,
     "settle(delivery, state): update (unless state is 0) and settle"},
    {"credit", (PyCFunction)(void (*)(void))credit, METH_FASTCALL, "credit(link) -> int"},
    {"read", (PyCFunction)(void (*)(void))read_socket, METH_FASTCALL,
     "read(transport, fd, max_reads) -> (bytes read, status)"},
    {"write", (PyCFunction)(void (*)(void))write_socket, METH_FASTCALL,
     "write(transport, fd) -> status"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "enmasse.amqp_hotpath",
    "The AMQP engine's per-message calls into proton-c (see the C source's opening comment).",
    -1, methods,
};

PyMODINIT_FUNC PyInit_amqp_hotpath(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "TRANSFER", KIND_TRANSFER) < 0 ||
        PyModule_AddIntConstant(m, "PARTIAL", KIND_PARTIAL) < 0 ||
        PyModule_AddIntConstant(m, "OUTCOME", KIND_OUTCOME) < 0 ||
        PyModule_AddIntConstant(m, "READ_AGAIN", READ_AGAIN) < 0 ||
        PyModule_AddIntConstant(m, "READ_EOF", READ_EOF) < 0 ||
        PyModule_AddIntConstant(m, "READ_INPUT_CLOSED", READ_INPUT_CLOSED) < 0 ||
        PyModule_AddIntConstant(m, "WRITE_DONE", WRITE_DONE) < 0 ||
        PyModule_AddIntConstant(m, "WRITE_HEAD_CLOSED", WRITE_HEAD_CLOSED) < 0 ||
        PyModule_AddIntConstant(m, "WRITE_BLOCKED", WRITE_BLOCKED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject *names = PyTuple_New(FUNCTION_COUNT);
    if (names == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    for (size_t i = 0; i < FUNCTION_COUNT; i++)
        PyTuple_SET_ITEM(names, i, PyUnicode_FromString(function_names[i]));
    if (PyModule_AddObject(m, "FUNCTIONS", names) < 0) {
        Py_DECREF(names);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
