/* The simulator's two inner loops in compiled code: the BFC replay and the FirstReady schedule.
 *
 * The auto-tuner simulates tens of plans of a 15,000-op step. Replaying each
 * step's ~15,000 allocations and frees through the Python BFC model
 * (tflms/simulation/allocator.py, BFCModel) took about 0.08 s of every plan,
 * and the FirstReady schedule (tflms/simulation/schedule.py, first_ready)
 * about 0.05 s. These are the same algorithms, rule for rule, as their Python
 * references (allocator._replay_region_py, schedule._first_ready_py), which
 * tests hold them to on random inputs and real steps: the same chunks, so the
 * same high-water mark to the byte, and the same op order and times to the
 * last bit (the same float operations in the same order).
 *
 * replay_region: the allocator is BFCModel without growth: one region from
 * address 0 of `region` bytes; requests are rounded up to 256 bytes; the
 * smallest free chunk that fits is taken (lowest address on ties), split when
 * it is at least twice the request or the rest reaches 128 MiB; a freed chunk
 * coalesces with its free neighbours. Free chunks are kept in an array sorted
 * by (size, address): a step has at most a few thousand of them.
 *
 * first_ready: ops become ready when their last predecessor ends; the ready
 * op with the earliest ready time runs first (ties: the lower name rank), on
 * its lane once the lane is free; a host-to-device copy is first dispatched
 * by the compute stream (MIN_SECONDS of it). A binary heap keyed by (ready
 * time, rank) pops exactly what Python's heapq pops: ranks are distinct, so
 * the order is total.
 *
 * Python API:
 *   replay_region(spaces, sizes, events, resident, region, limit, extra)
 *     spaces    bytes, one per buffer: 0 device, 1 host, 2 workspace
 *     sizes     int64 buffer (array('q')), bytes of each buffer
 *     events    list of tuples ending in (buffer, sign): sign +1 allocates, -1
 *               frees, 0 marks a timeline point (its buffer is not read)
 *     resident  int64 buffer, sizes allocated first and never freed (variables)
 *     region    bytes of the one region (no growth)
 *     limit     the allocator limit a workspace must end under, less
 *               round(extra * tensor bytes live)
 *     extra     float, the stack's tensor factor minus 1 (0.0: none)
 *   -> (in_use, tensors, host, tensor_peak, high_water, workspace_at_high)
 *     the first three are lists with one int per point: bytes of the chunks
 *     handed out, bytes of the live device tensors, bytes on the host.
 *
 *   first_ready(lanes, durations, offsets, targets, waiting, rank, compute, h2d, dispatch)
 *     lanes     int32 buffer, each op's lane number
 *     durations float64 buffer, each op's seconds
 *     offsets   int64 buffer (n + 1): op i's successors are targets[offsets[i]:offsets[i+1]]
 *     targets   int64 buffer, successor op numbers
 *     waiting   int64 buffer, each op's predecessor count
 *     rank      int64 buffer, each op's name rank (distinct)
 *     compute, h2d  the lane numbers of the compute stream and of host-to-device
 *               copies (>= 0; a number no op has is allowed)
 *     dispatch  seconds the compute stream spends dispatching a copy (MIN_SECONDS)
 *   -> (order, start, end, alloc, busy, lanes_used): order lists the ops
 *     scheduled (fewer than n: a cycle); start, end, alloc are per op; busy
 *     the busy seconds per lane number; lanes_used the lane numbers in the
 *     order they were first used.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MIN_ALLOCATION 256
#define MAX_INTERNAL_FRAGMENTATION ((int64_t)128 << 20)
#define MAX_BYTES ((int64_t)1 << 56) /* any size or sum of sizes stays far from overflow */

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

/* Grows one array of a Bfc to `cap` elements; on failure the old array stays (and is freed). */
#define BFC_GROW(field, cap)                                                       \
    do {                                                                           \
        void *grown = realloc(a->field, sizeof(*a->field) * (size_t)(cap));        \
        if (!grown) return -1;                                                     \
        a->field = grown;                                                          \
    } while (0)

static int bfc_grow(Bfc *a) {
    int32_t cap = a->cap ? a->cap * 2 : 1024;
    BFC_GROW(off, cap);
    BFC_GROW(size, cap);
    BFC_GROW(prev, cap);
    BFC_GROW(next, cap);
    BFC_GROW(is_free, cap);
    BFC_GROW(spare, cap);
    BFC_GROW(order, cap);
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
    if (nbytes <= 0) return -1;  /* replay_region refuses sizes above MAX_BYTES */
    int64_t size = (nbytes + MIN_ALLOCATION - 1) / MIN_ALLOCATION * MIN_ALLOCATION;
    int32_t at = bfc_lower(a, size, -1);
    if (at == a->n_order) return -1;
    int32_t c = a->order[at];
    if (has_below && a->off[c] + size > below) return -1;
    bfc_take_at(a, at);
    if (a->size[c] - size >= size || a->size[c] - size >= MAX_INTERNAL_FRAGMENTATION) {
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
    Py_buffer spaces, sizes, resident;
    PyObject *events;
    long long region, limit;
    double extra;
    if (!PyArg_ParseTuple(args, "y*y*O!y*LLd", &spaces, &sizes, &PyList_Type, &events,
                          &resident, &region, &limit, &extra))
        return NULL;
    PyObject *result = NULL, *in_use = NULL, *tensors_at = NULL, *host_at = NULL;
    int32_t *handle = NULL;
    Bfc a;
    memset(&a, 0, sizeof a);
    Py_ssize_t n_buffers = spaces.len;
    Py_ssize_t n_events = PyList_GET_SIZE(events);
    const unsigned char *space = spaces.buf;
    const int64_t *nbytes = sizes.buf, *kept = resident.buf;
    if (sizes.len != (Py_ssize_t)sizeof(int64_t) * n_buffers ||
        resident.len % (Py_ssize_t)sizeof(int64_t) || region <= 0 || region > MAX_BYTES) {
        PyErr_SetString(PyExc_ValueError,
                        "replay_region: sizes must hold one int64 per space, resident whole "
                        "int64s, and region must be positive and at most 2**56 bytes");
        goto done;
    }
    for (Py_ssize_t b = 0; b < n_buffers; b++) {
        if (nbytes[b] < 0 || nbytes[b] > MAX_BYTES) {
            PyErr_Format(PyExc_ValueError, "replay_region: buffer %zd has %lld bytes (0 to "
                         "2**56 allowed)", b, (long long)nbytes[b]);
            goto done;
        }
    }
    for (Py_ssize_t r = 0; r < resident.len / (Py_ssize_t)sizeof(int64_t); r++) {
        if (kept[r] < 0 || kept[r] > MAX_BYTES) {
            PyErr_Format(PyExc_ValueError, "replay_region: resident size %lld out of range (0 "
                         "to 2**56 bytes)", (long long)kept[r]);
            goto done;
        }
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
    /* rounded up to the granularity, as BFCModel(allow_growth=False) takes its region */
    int32_t first = bfc_new_chunk(
        &a, 0, ((int64_t)region + MIN_ALLOCATION - 1) / MIN_ALLOCATION * MIN_ALLOCATION);
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
        PyObject *event = PyList_GET_ITEM(events, e);
        Py_ssize_t width = PyTuple_Check(event) ? PyTuple_GET_SIZE(event) : 0;
        /* ints only: converting them runs no Python code that could change `events` */
        if (width < 2 || !PyLong_Check(PyTuple_GET_ITEM(event, width - 1)) ||
            !PyLong_Check(PyTuple_GET_ITEM(event, width - 2))) {
            PyErr_Format(PyExc_TypeError, "replay_region: event %zd is not a tuple ending in "
                         "(buffer, sign), two ints", e);
            goto done;
        }
        long s = PyLong_AsLong(PyTuple_GET_ITEM(event, width - 1));
        if (s == -1 && PyErr_Occurred()) goto done;
        if (s < -1 || s > 1) {
            PyErr_Format(PyExc_ValueError, "replay_region: event %zd has sign %ld (+1, -1 or 0)",
                         e, s);
            goto done;
        }
        if (!s) {
            if (append_int(in_use, a.in_use) || append_int(tensors_at, tensors) ||
                append_int(host_at, host))
                goto done;
            continue;
        }
        int64_t b = PyLong_AsLongLong(PyTuple_GET_ITEM(event, width - 2));
        if (b == -1 && PyErr_Occurred()) goto done;
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
    PyBuffer_Release(&resident);
    return result;
}

#define MAX_LANES (1 << 20)

typedef struct {
    double ready;
    int64_t rank, op;
} Ready;

static int ready_less(const Ready *a, const Ready *b) {
    return a->ready < b->ready || (a->ready == b->ready && a->rank < b->rank);
}

static void heap_push(Ready *heap, Py_ssize_t *n, Ready item) {
    Py_ssize_t i = (*n)++;
    while (i > 0) {
        Py_ssize_t parent = (i - 1) / 2;
        if (!ready_less(&item, &heap[parent])) break;
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = item;
}

static Ready heap_pop(Ready *heap, Py_ssize_t *n) {
    Ready top = heap[0], last = heap[--(*n)];
    Py_ssize_t i = 0;
    for (;;) {
        Py_ssize_t child = 2 * i + 1;
        if (child >= *n) break;
        if (child + 1 < *n && ready_less(&heap[child + 1], &heap[child])) child++;
        if (!ready_less(&heap[child], &last)) break;
        heap[i] = heap[child];
        i = child;
    }
    if (*n > 0) heap[i] = last;
    return top;
}

static PyObject *float_list(const double *values, Py_ssize_t n) {
    PyObject *list = PyList_New(n);
    if (!list) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyFloat_FromDouble(values[i]);
        if (!item) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

static PyObject *first_ready(PyObject *self, PyObject *args) {
    Py_buffer lanes_buf, durations_buf, offsets_buf, targets_buf, waiting_buf, rank_buf;
    long long compute, h2d;
    double dispatch_s;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*LLd", &lanes_buf, &durations_buf, &offsets_buf,
                          &targets_buf, &waiting_buf, &rank_buf, &compute, &h2d, &dispatch_s))
        return NULL;
    PyObject *result = NULL, *order = NULL, *used = NULL;
    Py_ssize_t n = durations_buf.len / (Py_ssize_t)sizeof(double);
    Py_ssize_t n_targets = targets_buf.len / (Py_ssize_t)sizeof(int64_t);
    const int32_t *lane = lanes_buf.buf;
    const double *duration = durations_buf.buf;
    const int64_t *offset = offsets_buf.buf, *target = targets_buf.buf, *rank = rank_buf.buf;
    double *ready_at = NULL, *start = NULL, *end = NULL, *alloc = NULL, *lane_free = NULL,
           *busy = NULL;
    int64_t *waiting = NULL;
    char *lane_seen = NULL;
    Ready *heap = NULL;
    int64_t n_lanes = 0;
    int lanes_ok = lanes_buf.len == (Py_ssize_t)sizeof(int32_t) * n;
    for (Py_ssize_t i = 0; i < n && lanes_ok; i++) {
        if (lane[i] < 0 || lane[i] >= MAX_LANES) lanes_ok = 0;
        else if ((int64_t)lane[i] + 1 > n_lanes) n_lanes = (int64_t)lane[i] + 1;
    }
    if (!lanes_ok || offsets_buf.len != (Py_ssize_t)sizeof(int64_t) * (n + 1) ||
        waiting_buf.len != (Py_ssize_t)sizeof(int64_t) * n ||
        rank_buf.len != (Py_ssize_t)sizeof(int64_t) * n || compute < 0 || h2d < 0 ||
        compute >= MAX_LANES || h2d >= MAX_LANES) {
        PyErr_SetString(PyExc_ValueError,
                        "first_ready: lanes (int32, 0 to 2**20), waiting and rank (int64) need "
                        "one entry per duration, offsets one more, and compute and h2d are lane "
                        "numbers in the same range");
        goto done;
    }
    if (compute + 1 > n_lanes) n_lanes = compute + 1;
    if (h2d + 1 > n_lanes) n_lanes = h2d + 1;
    ready_at = calloc(n ? n : 1, sizeof(double));
    start = calloc(n ? n : 1, sizeof(double));
    end = calloc(n ? n : 1, sizeof(double));
    alloc = calloc(n ? n : 1, sizeof(double));
    waiting = malloc(sizeof(int64_t) * (n ? n : 1));
    heap = malloc(sizeof(Ready) * (n ? n : 1));
    lane_free = calloc(n_lanes ? n_lanes : 1, sizeof(double));
    busy = calloc(n_lanes ? n_lanes : 1, sizeof(double));
    lane_seen = calloc(n_lanes ? n_lanes : 1, 1);
    order = PyList_New(0);
    used = PyList_New(0);
    if (!ready_at || !start || !end || !alloc || !waiting || !heap || !lane_free || !busy ||
        !lane_seen || !order || !used) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(waiting, waiting_buf.buf, sizeof(int64_t) * n);
    Py_ssize_t n_heap = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (waiting[i] == 0) heap_push(heap, &n_heap, (Ready){0.0, rank[i], i});
    while (n_heap) {
        Ready next = heap_pop(heap, &n_heap);
        Py_ssize_t i = next.op;
        double t_ready = next.ready;
        int32_t l = lane[i];
        if (l == h2d) { /* dispatched by the compute stream's executor, in order */
            double dispatch = t_ready > lane_free[compute] ? t_ready : lane_free[compute];
            lane_free[compute] = dispatch + dispatch_s;
            t_ready = dispatch + dispatch_s;
        }
        double t0 = t_ready > lane_free[l] ? t_ready : lane_free[l];
        double t1 = t0 + duration[i];
        start[i] = t0;
        end[i] = t1;
        alloc[i] = l == h2d ? t_ready : t0;
        lane_free[l] = t1;
        busy[l] = busy[l] + duration[i];
        if (!lane_seen[l]) {
            lane_seen[l] = 1;
            if (append_int(used, l)) goto done;
        }
        if (append_int(order, i)) goto done;
        for (int64_t e = offset[i]; e < offset[i + 1]; e++) {
            if (e < 0 || e >= n_targets || target[e] < 0 || target[e] >= n) {
                PyErr_SetString(PyExc_IndexError, "first_ready: a successor out of range");
                goto done;
            }
            int64_t j = target[e];
            if (t1 > ready_at[j]) ready_at[j] = t1;
            if (--waiting[j] == 0) heap_push(heap, &n_heap, (Ready){ready_at[j], rank[j], j});
        }
    }
    PyObject *starts = float_list(start, n), *ends = float_list(end, n),
             *allocs = float_list(alloc, n), *busies = float_list(busy, n_lanes);
    if (starts && ends && allocs && busies)
        result = Py_BuildValue("OOOOOO", order, starts, ends, allocs, busies, used);
    Py_XDECREF(starts);
    Py_XDECREF(ends);
    Py_XDECREF(allocs);
    Py_XDECREF(busies);
done:
    Py_XDECREF(order);
    Py_XDECREF(used);
    free(ready_at);
    free(start);
    free(end);
    free(alloc);
    free(waiting);
    free(heap);
    free(lane_free);
    free(busy);
    free(lane_seen);
    PyBuffer_Release(&lanes_buf);
    PyBuffer_Release(&durations_buf);
    PyBuffer_Release(&offsets_buf);
    PyBuffer_Release(&targets_buf);
    PyBuffer_Release(&waiting_buf);
    PyBuffer_Release(&rank_buf);
    return result;
}

static PyMethodDef methods[] = {
    {"first_ready", first_ready, METH_VARARGS,
     "first_ready(lanes, durations, offsets, targets, waiting, rank, compute, h2d, dispatch) -> "
     "(order, start, end, alloc, busy, lanes_used)"},
    {"replay_region", replay_region, METH_VARARGS,
     "replay_region(spaces, sizes, events, resident, region, limit, extra) -> "
     "(in_use, tensors, host, tensor_peak, high_water, workspace_at_high)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT,
                                    "kernels",
                                    "The simulator's inner loops (see allocator.py, schedule.py).",
                                    -1,
                                    methods,
                                    NULL,
                                    NULL,
                                    NULL,
                                    NULL};

PyMODINIT_FUNC PyInit_kernels(void) { return PyModule_Create(&module); }
