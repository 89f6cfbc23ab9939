/* One step's device buffers replayed through one BFC region, in compiled code.
 *
 * The auto-tuner simulates tens of plans of a 15,000-op step, and replaying
 * each step's ~15,000 allocations and frees through the Python BFC model
 * (tflms/simulation/allocator.py, BFCModel) took about 0.08 s of the 0.2 s
 * memory trace of every plan. This is the same replay, rule for rule, as
 * allocator.replay_region's Python reference (`_replay_region_py`), which
 * tests/tflms/test_allocator.py holds it to on random event sequences and on
 * real steps: the same chunks, so the same high-water mark to the byte.
 *
 * The allocator is BFCModel without growth: one region from address 0 of
 * `region` bytes; requests are rounded up to 256 bytes; the smallest free
 * chunk that fits is taken (lowest address on ties), split when it is at
 * least twice the request or the rest reaches 128 MiB; a freed chunk
 * coalesces with its free neighbours. Free chunks are kept in an array
 * sorted by (size, address): a step has at most a few thousand of them.
 *
 * Python API:
 *   replay_region(spaces, sizes, buffers, signs, resident, region, limit, extra)
 *     spaces    bytes, one per buffer: 0 device, 1 host, 2 workspace
 *     sizes     int64 buffer (array('q')), bytes of each buffer
 *     buffers   int64 buffer, the buffer of each event (any value for a point)
 *     signs     int8 buffer (array('b')), +1 allocate, -1 free, 0 a timeline point
 *     resident  int64 buffer, sizes allocated first and never freed (variables)
 *     region    bytes of the one region (no growth)
 *     limit     the allocator limit a workspace must end under, less
 *               round(extra * tensor bytes live)
 *     extra     float, the stack's tensor factor minus 1 (0.0: none)
 *   -> (in_use, tensors, host, tensor_peak, high_water, workspace_at_high)
 *     the first three are lists with one int per point: bytes of the chunks
 *     handed out, bytes of the live device tensors, bytes on the host.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MIN_ALLOCATION 256
#define MAX_INTERNAL_FRAGMENTATION ((int64_t)128 << 20)

typedef struct {
    int64_t *off, *size;
    int32_t *prev, *next;
    char *is_free;
    int32_t n, cap;        /* chunk slots in use / allocated */
    int32_t *spare;        /* slots of merged-away chunks, reused first */
    int32_t n_spare;
    int32_t *order;        /* free chunks sorted by (size, off) */
    int32_t n_order;
    int64_t in_use, high_water;
} Bfc;

static int bfc_grow(Bfc *a) {
    int32_t cap = a->cap ? a->cap * 2 : 1024;
    int64_t *off = realloc(a->off, sizeof(int64_t) * cap);
    if (!off) return -1;
    a->off = off;
    int64_t *size = realloc(a->size, sizeof(int64_t) * cap);
    if (!size) return -1;
    a->size = size;
    int32_t *prev = realloc(a->prev, sizeof(int32_t) * cap);
    if (!prev) return -1;
    a->prev = prev;
    int32_t *next = realloc(a->next, sizeof(int32_t) * cap);
    if (!next) return -1;
    a->next = next;
    char *is_free = realloc(a->is_free, cap);
    if (!is_free) return -1;
    a->is_free = is_free;
    int32_t *spare = realloc(a->spare, sizeof(int32_t) * cap);
    if (!spare) return -1;
    a->spare = spare;
    int32_t *order = realloc(a->order, sizeof(int32_t) * cap);
    if (!order) return -1;
    a->order = order;
    a->cap = cap;
    return 0;
}

static void bfc_release(Bfc *a) {
    free(a->off);
    free(a->size);
    free(a->prev);
    free(a->next);
    free(a->is_free);
    free(a->spare);
    free(a->order);
}

static int32_t bfc_new_chunk(Bfc *a, int64_t off, int64_t size) {
    int32_t c;
    if (a->n_spare) {
        c = a->spare[--a->n_spare];
    } else {
        if (a->n == a->cap && bfc_grow(a) < 0) return -1;
        c = a->n++;
    }
    a->off[c] = off;
    a->size[c] = size;
    a->prev[c] = a->next[c] = -1;
    a->is_free[c] = 0;
    return c;
}

/* First position in the free order whose (size, off) is not below (size, off). */
static int32_t bfc_lower(const Bfc *a, int64_t size, int64_t off) {
    int32_t lo = 0, hi = a->n_order;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        int32_t c = a->order[mid];
        if (a->size[c] < size || (a->size[c] == size && a->off[c] < off))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void bfc_put(Bfc *a, int32_t c) {
    int32_t at = bfc_lower(a, a->size[c], a->off[c]);
    memmove(a->order + at + 1, a->order + at, sizeof(int32_t) * (a->n_order - at));
    a->order[at] = c;
    a->n_order++;
    a->is_free[c] = 1;
}

static void bfc_take_at(Bfc *a, int32_t at) {
    int32_t c = a->order[at];
    memmove(a->order + at, a->order + at + 1, sizeof(int32_t) * (a->n_order - at - 1));
    a->n_order--;
    a->is_free[c] = 0;
}

static void bfc_take(Bfc *a, int32_t c) { bfc_take_at(a, bfc_lower(a, a->size[c], a->off[c])); }

/* The chunk handed out for nbytes, or -1 (0 bytes, no free chunk fits, or it would end above
 * `below` when has_below). Returns -2 when out of memory for the bookkeeping. */
static int32_t bfc_allocate(Bfc *a, int64_t nbytes, int has_below, int64_t below) {
    if (nbytes <= 0) return -1;
    int64_t size = (nbytes + MIN_ALLOCATION - 1) / MIN_ALLOCATION * MIN_ALLOCATION;
    int32_t at = bfc_lower(a, size, -1);
    if (at == a->n_order) return -1;
    int32_t c = a->order[at];
    if (has_below && a->off[c] + size > below) return -1;
    bfc_take_at(a, at);
    if (a->size[c] >= 2 * size || a->size[c] - size >= MAX_INTERNAL_FRAGMENTATION) {
        int32_t rest = bfc_new_chunk(a, a->off[c] + size, a->size[c] - size);
        if (rest < 0) return -2;
        a->prev[rest] = c;
        a->next[rest] = a->next[c];
        if (a->next[c] >= 0) a->prev[a->next[c]] = rest;
        a->next[c] = rest;
        a->size[c] = size;
        bfc_put(a, rest);
    }
    a->in_use += a->size[c];
    if (a->off[c] + a->size[c] > a->high_water) a->high_water = a->off[c] + a->size[c];
    return c;
}

/* `right` joins `left` (its neighbour at the lower address); its slot is reused later. */
static void bfc_merge(Bfc *a, int32_t left, int32_t right) {
    a->size[left] += a->size[right];
    a->next[left] = a->next[right];
    if (a->next[right] >= 0) a->prev[a->next[right]] = left;
    a->spare[a->n_spare++] = right;
}

static void bfc_free(Bfc *a, int32_t c) {
    a->in_use -= a->size[c];
    int32_t after = a->next[c], before = a->prev[c];
    if (after >= 0 && a->is_free[after]) {
        bfc_take(a, after);
        bfc_merge(a, c, after);
    }
    if (before >= 0 && a->is_free[before]) {
        bfc_take(a, before);
        bfc_merge(a, before, c);
        c = before;
    }
    bfc_put(a, c);
}

static int append_int(PyObject *list, int64_t value) {
    PyObject *item = PyLong_FromLongLong(value);
    if (!item) return -1;
    int failed = PyList_Append(list, item);
    Py_DECREF(item);
    return failed;
}

static PyObject *replay_region(PyObject *self, PyObject *args) {
    Py_buffer spaces, sizes, buffers, signs, resident;
    long long region, limit;
    double extra;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*LLd", &spaces, &sizes, &buffers, &signs, &resident,
                          &region, &limit, &extra))
        return NULL;
    PyObject *result = NULL, *in_use = NULL, *tensors_at = NULL, *host_at = NULL;
    int32_t *handle = NULL;
    Bfc a;
    memset(&a, 0, sizeof a);
    Py_ssize_t n_buffers = spaces.len;
    Py_ssize_t n_events = signs.len;
    const unsigned char *space = spaces.buf;
    const int64_t *nbytes = sizes.buf, *buffer = buffers.buf, *kept = resident.buf;
    const signed char *sign = signs.buf;
    if (sizes.len != (Py_ssize_t)sizeof(int64_t) * n_buffers ||
        buffers.len != (Py_ssize_t)sizeof(int64_t) * n_events ||
        resident.len % (Py_ssize_t)sizeof(int64_t) || region <= 0) {
        PyErr_SetString(PyExc_ValueError,
                        "replay_region: sizes must hold one int64 per space, buffers one int64 "
                        "per sign, resident whole int64s, and region must be positive");
        goto done;
    }
    handle = malloc(sizeof(int32_t) * (n_buffers ? n_buffers : 1));
    in_use = PyList_New(0);
    tensors_at = PyList_New(0);
    host_at = PyList_New(0);
    if (!handle || !in_use || !tensors_at || !host_at) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t b = 0; b < n_buffers; b++) handle[b] = -1;
    int32_t first = bfc_new_chunk(&a, 0, (int64_t)region / MIN_ALLOCATION * MIN_ALLOCATION);
    if (first < 0) {
        PyErr_NoMemory();
        goto done;
    }
    bfc_put(&a, first);
    int64_t tensors = 0, tensor_peak, workspace = 0, workspace_at_high = 0, host = 0, high;
    for (Py_ssize_t r = 0; r < resident.len / (Py_ssize_t)sizeof(int64_t); r++) {
        if (bfc_allocate(&a, kept[r], 0, 0) == -2) {
            PyErr_NoMemory();
            goto done;
        }
        tensors += kept[r];
    }
    tensor_peak = tensors;
    high = a.high_water;
    for (Py_ssize_t e = 0; e < n_events; e++) {
        int s = sign[e];
        if (!s) {
            if (append_int(in_use, a.in_use) || append_int(tensors_at, tensors) ||
                append_int(host_at, host))
                goto done;
            continue;
        }
        int64_t b = buffer[e];
        if (b < 0 || b >= n_buffers) {
            PyErr_Format(PyExc_IndexError, "replay_region: event %zd names buffer %lld of %zd",
                         e, (long long)b, n_buffers);
            goto done;
        }
        int64_t nb = nbytes[b];
        if (space[b] == 0) {  /* a device tensor */
            if (s > 0) {
                int32_t c = bfc_allocate(&a, nb, 0, 0);
                if (c == -2) {
                    PyErr_NoMemory();
                    goto done;
                }
                handle[b] = c;
                tensors += nb;
                if (tensors > tensor_peak) tensor_peak = tensors;
            } else {
                if (handle[b] >= 0) bfc_free(&a, handle[b]);
                handle[b] = -1;
                tensors -= nb;
            }
        } else if (space[b] == 1) {  /* on the host */
            host += s > 0 ? nb : -nb;
        } else if (s > 0) {  /* a workspace: only under the limit */
            int64_t below = (int64_t)limit - (int64_t)nearbyint(extra * (double)tensors);
            int32_t c = bfc_allocate(&a, nb, 1, below);
            if (c == -2) {
                PyErr_NoMemory();
                goto done;
            }
            if (c >= 0) {
                handle[b] = c;
                workspace += nb;
            }
        } else if (handle[b] >= 0) {
            bfc_free(&a, handle[b]);
            handle[b] = -1;
            workspace -= nb;
        }
        if (a.high_water > high) {
            high = a.high_water;
            workspace_at_high = workspace;
        }
    }
    result = Py_BuildValue("OOOLLL", in_use, tensors_at, host_at, (long long)tensor_peak,
                           (long long)high, (long long)workspace_at_high);
done:
    Py_XDECREF(in_use);
    Py_XDECREF(tensors_at);
    Py_XDECREF(host_at);
    free(handle);
    bfc_release(&a);
    PyBuffer_Release(&spaces);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&buffers);
    PyBuffer_Release(&signs);
    PyBuffer_Release(&resident);
    return result;
}

static PyMethodDef methods[] = {
    {"replay_region", replay_region, METH_VARARGS,
     "replay_region(spaces, sizes, buffers, signs, resident, region, limit, extra) -> "
     "(in_use, tensors, host, tensor_peak, high_water, workspace_at_high)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT,
                                    "bfcreplay",
                                    "A step's buffers through one BFC region (see allocator.py).",
                                    -1,
                                    methods,
                                    NULL,
                                    NULL,
                                    NULL,
                                    NULL};

PyMODINIT_FUNC PyInit_bfcreplay(void) { return PyModule_Create(&module); }
