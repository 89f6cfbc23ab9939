/* Fast float16/bfloat16 <-> float32 conversions for ddl_tf's host-side reductions.
 *
 * numpy converts float16 one element at a time (about 2-3 ns per element
 * here), which made every half-precision reduction and every fp16-compressed
 * pack several times slower than the MPI transfer around it. These loops
 * produce exactly numpy's (and ml_dtypes') results for every non-NaN value:
 * round to nearest even, overflow to infinity, subnormals kept; a NaN stays a
 * NaN of the same sign.
 *
 * float16 uses the F16C instructions (x86-64) when the CPU has them, else it
 * reports that it cannot help and ddl_tf falls back to numpy; bfloat16 is
 * plain integer arithmetic the compiler vectorizes.
 *
 * Python API (all arguments are C-contiguous buffers, lengths in elements):
 *   to_float32(kind, src, dst)    kind 0 = float16, 1 = bfloat16; src 2 bytes/elt, dst float32
 *   from_float32(kind, src, dst)  src float32, dst 2 bytes/elt
 *   sum_into(kind, src, inout)    inout = round(float32(inout) + float32(src)), 2 bytes/elt each
 *   has_f16c() -> bool
 * Each returns False (doing nothing) when it cannot convert this kind here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DDL_HAVE_X86 1
#else
#define DDL_HAVE_X86 0
#endif

static int cpu_has_f16c(void) {
#if DDL_HAVE_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
#else
    return 0;
#endif
}

#if DDL_HAVE_X86
__attribute__((target("avx,f16c"))) static void f16_to_f32(const uint16_t *src, float *dst,
                                                           Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(src + i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    if (i < n) {
        uint16_t tail_in[8] = {0};
        float tail_out[8];
        memcpy(tail_in, src + i, (size_t)(n - i) * sizeof(uint16_t));
        _mm256_storeu_ps(tail_out, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tail_in)));
        memcpy(dst + i, tail_out, (size_t)(n - i) * sizeof(float));
    }
}

__attribute__((target("avx,f16c"))) static void f32_to_f16(const float *src, uint16_t *dst,
                                                           Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    if (i < n) {
        float tail_in[8] = {0};
        uint16_t tail_out[8];
        memcpy(tail_in, src + i, (size_t)(n - i) * sizeof(float));
        _mm_storeu_si128((__m128i *)tail_out,
                         _mm256_cvtps_ph(_mm256_loadu_ps(tail_in), _MM_FROUND_TO_NEAREST_INT));
        memcpy(dst + i, tail_out, (size_t)(n - i) * sizeof(uint16_t));
    }
}

__attribute__((target("avx,f16c"))) static void f16_sum_into(const uint16_t *src, uint16_t *inout,
                                                             Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i)));
        __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(inout + i)));
        __m128i h = _mm256_cvtps_ph(_mm256_add_ps(a, b), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(inout + i), h);
    }
    if (i < n) {
        uint16_t ta[8] = {0}, tb[8] = {0};
        memcpy(ta, src + i, (size_t)(n - i) * sizeof(uint16_t));
        memcpy(tb, inout + i, (size_t)(n - i) * sizeof(uint16_t));
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)ta));
        __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tb));
        _mm_storeu_si128((__m128i *)tb,
                         _mm256_cvtps_ph(_mm256_add_ps(a, b), _MM_FROUND_TO_NEAREST_INT));
        memcpy(inout + i, tb, (size_t)(n - i) * sizeof(uint16_t));
    }
}
#endif

static inline uint16_t round_bf16(uint32_t u) {
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16; /* nearest, ties to even */
    uint32_t nan = ((u >> 16) | 0x40u) & 0xffffu;                /* quiet NaN, same sign */
    return (uint16_t)(((u & 0x7fffffffu) > 0x7f800000u) ? nan : rounded);
}

static void bf16_sum_into(const uint16_t *src, uint16_t *inout, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        union { uint32_t u; float f; } a, b, c;
        a.u = (uint32_t)src[i] << 16;
        b.u = (uint32_t)inout[i] << 16;
        c.f = a.f + b.f;
        inout[i] = round_bf16(c.u);
    }
}

static void bf16_to_f32(const uint16_t *src, float *dst, Py_ssize_t n) {
    uint32_t *out = (uint32_t *)dst;
    for (Py_ssize_t i = 0; i < n; i++) out[i] = (uint32_t)src[i] << 16;
}

static void f32_to_bf16(const float *src, uint16_t *dst, Py_ssize_t n) {
    const uint32_t *in = (const uint32_t *)src;
    for (Py_ssize_t i = 0; i < n; i++) dst[i] = round_bf16(in[i]);
}

static int f16c_available = 0;

static PyObject *convert(PyObject *args, int to_float) {
    int kind;
    Py_buffer src, dst;
    if (!PyArg_ParseTuple(args, "iy*w*", &kind, &src, &dst)) return NULL;
    Py_ssize_t half_bytes = to_float ? src.len : dst.len;
    Py_ssize_t float_bytes = to_float ? dst.len : src.len;
    PyObject *result = Py_False;
    if (kind != 0 && kind != 1) {
        PyErr_Format(PyExc_ValueError, "kind must be 0 (float16) or 1 (bfloat16), got %d", kind);
        result = NULL;
    } else if (half_bytes % 2 || float_bytes != 2 * half_bytes) {
        PyErr_Format(PyExc_ValueError,
                     "buffer sizes do not match: %zd bytes of 16-bit values, %zd of float32",
                     half_bytes, float_bytes);
        result = NULL;
    } else if (kind == 1 || f16c_available) {
        Py_ssize_t n = half_bytes / 2;
        Py_BEGIN_ALLOW_THREADS
        if (kind == 1) {
            if (to_float) bf16_to_f32((const uint16_t *)src.buf, (float *)dst.buf, n);
            else f32_to_bf16((const float *)src.buf, (uint16_t *)dst.buf, n);
        }
#if DDL_HAVE_X86
        else if (to_float) f16_to_f32((const uint16_t *)src.buf, (float *)dst.buf, n);
        else f32_to_f16((const float *)src.buf, (uint16_t *)dst.buf, n);
#endif
        Py_END_ALLOW_THREADS
        result = Py_True;
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    Py_XINCREF(result);
    return result;
}

static PyObject *sum_into(PyObject *self, PyObject *args) {
    int kind;
    Py_buffer src, inout;
    (void)self;
    if (!PyArg_ParseTuple(args, "iy*w*", &kind, &src, &inout)) return NULL;
    PyObject *result = Py_False;
    if (kind != 0 && kind != 1) {
        PyErr_Format(PyExc_ValueError, "kind must be 0 (float16) or 1 (bfloat16), got %d", kind);
        result = NULL;
    } else if (src.len != inout.len || src.len % 2) {
        PyErr_Format(PyExc_ValueError, "buffer sizes differ: %zd and %zd bytes", src.len,
                     inout.len);
        result = NULL;
    } else if (kind == 1 || f16c_available) {
        Py_ssize_t n = src.len / 2;
        Py_BEGIN_ALLOW_THREADS
        if (kind == 1) bf16_sum_into((const uint16_t *)src.buf, (uint16_t *)inout.buf, n);
#if DDL_HAVE_X86
        else f16_sum_into((const uint16_t *)src.buf, (uint16_t *)inout.buf, n);
#endif
        Py_END_ALLOW_THREADS
        result = Py_True;
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&inout);
    Py_XINCREF(result);
    return result;
}

static PyObject *to_float32(PyObject *self, PyObject *args) {
    (void)self;
    return convert(args, 1);
}
static PyObject *from_float32(PyObject *self, PyObject *args) {
    (void)self;
    return convert(args, 0);
}
static PyObject *has_f16c(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(f16c_available);
}

static PyMethodDef methods[] = {
    {"to_float32", to_float32, METH_VARARGS, "to_float32(kind, src, dst) -> bool"},
    {"from_float32", from_float32, METH_VARARGS, "from_float32(kind, src, dst) -> bool"},
    {"sum_into", sum_into, METH_VARARGS, "sum_into(kind, src, inout) -> bool"},
    {"has_f16c", has_f16c, METH_NOARGS, "Whether float16 conversions run here (F16C)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT,
                                    "halfkernels",
                                    "Fast 16-bit float conversions (see halfconv.py).",
                                    -1,
                                    methods,
                                    NULL,
                                    NULL,
                                    NULL,
                                    NULL};

PyMODINIT_FUNC PyInit_halfkernels(void) {
    f16c_available = cpu_has_f16c();
    return PyModule_Create(&module);
}
