/* The checksum's row sums (reshardctl/runtime/checksum_rows.py, "native" paths), exact in float64.

   For every row i: the eight sums  S_k = sum_t x_t * w[t][k]  over its limbs x_t = s(b_2t) + 256 s(b_2t+1)
   (bytes as two's complement, a zero byte padding an odd length), each reduced to [0, p), p = 2**31 - 1.
   |x_t| <= 32896 and 0 <= w < p, so every product is an integer below 7.07e13 < 2**46.01 and a sum of
   at most 64 of them stays below 4.53e15 < 2**53: float64 holds every product and partial sum
   exactly, whatever the order of the additions or the use of FMA (setup.py compiles with
   -ffp-contract=fast: ISO C modes would otherwise forbid fused multiply-adds). Each vector lane adds at most 64
   products before it goes to int64 (a row of R <= 2**15 limbs totals < 2**61.01), then one reduction
   mod p per row.

   Two variants of the same loop (one source, a macro): 2 limbs per vector (SSE2, any x86-64, and
   the fallback elsewhere) and 4 per vector with FMA ("avx2"), compiled with a target attribute and
   offered only where the CPU has AVX2 and FMA. Which path a process uses is measured, not assumed
   (checksum_choice.py). The data is read where it lies: rows are (start, valid) windows of the
   buffer; bytes past ``valid`` count as zero and are never read. Every window is checked against the
   buffer before any is read. The GIL is released while the sums run. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define P 2147483647LL
#define SUMS 8
#define LANE_TERMS 64
#define MAX_ROW 32768

typedef double v2d __attribute__((vector_size(16)));
typedef double v4d __attribute__((vector_size(32)));
typedef int32_t v2i __attribute__((vector_size(8)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef int16_t v2s __attribute__((vector_size(4)));
typedef int16_t v4s __attribute__((vector_size(8)));

typedef void (*row_fn)(const int8_t *b, int64_t n, int odd, const double *w, int64_t R, int64_t *out);

/* One row: n whole limbs, then an odd byte if ``odd``; w: double [8][R] (sum k's weights at w + k R).
   L limbs per vector: each is read as a little-endian int16 v, and x = s(lo) + 256 s(hi) is
   ((v << 24) >> 24) + ((v >> 8) << 8) in int32; the vector of L limbs times each sum's L weights goes
   to that sum's accumulator (eight independent ones). A lane adds at most LANE_TERMS products before
   the block's lanes go to int64. The last n mod L limbs and the odd byte: one product each, in int64. */
#define ROW_FN(NAME, ATTR, VD, VI, VS, L)                                                              \
    ATTR static void NAME(const int8_t *b, int64_t n, int odd, const double *w, int64_t R, int64_t *out) { \
        int64_t tot[SUMS] = {0};                                                                       \
        int64_t t = 0;                                                                                 \
        const int64_t whole = n - n % L;                                                               \
        while (t < whole) {                                                                            \
            int64_t e = t + L * LANE_TERMS < whole ? t + L * LANE_TERMS : whole;                       \
            VD a[SUMS];                                                                                \
            memset(a, 0, sizeof a);                                                                    \
            for (; t < e; t += L) {                                                                    \
                VS raw;                                                                                \
                memcpy(&raw, b + 2 * t, sizeof raw);                                                   \
                VI v = __builtin_convertvector(raw, VI);                                               \
                VD x = __builtin_convertvector(((v << 24) >> 24) + ((v >> 8) << 8), VD);               \
                for (int k = 0; k < SUMS; k++) {                                                       \
                    VD wv;                                                                             \
                    memcpy(&wv, w + k * R + t, sizeof wv);                                             \
                    a[k] += x * wv;                                                                    \
                }                                                                                      \
            }                                                                                          \
            for (int k = 0; k < SUMS; k++)                                                             \
                for (int l = 0; l < L; l++) tot[k] += (int64_t)a[k][l];                                \
        }                                                                                              \
        for (; t < n; t++) {                                                                           \
            double x = (double)((int)b[2 * t] + 256 * (int)b[2 * t + 1]);                              \
            for (int k = 0; k < SUMS; k++) tot[k] += (int64_t)(x * w[k * R + t]);                      \
        }                                                                                              \
        if (odd)                                                                                       \
            for (int k = 0; k < SUMS; k++) tot[k] += (int64_t)((double)b[2 * n] * w[k * R + n]);       \
        for (int k = 0; k < SUMS; k++) {                                                               \
            int64_t r = tot[k] % P;                                                                    \
            out[k] = r < 0 ? r + P : r;                                                                \
        }                                                                                              \
    }

ROW_FN(row_base, , v2d, v2i, v2s, 2)
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_AVX2_VARIANT 1
ROW_FN(row_avx2, __attribute__((target("avx2,fma"))), v4d, v4i, v4s, 4)
#endif

static int avx2_usable(void) {
#ifdef HAVE_AVX2_VARIANT
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

/* row_sums(buf_addr, buf_len, start_addr, valid_addr, rows, R, weights_addr, out_addr, variant):
   addresses of contiguous CPU tensors (uint8 buffer; int64 [rows] starts and valid byte counts;
   float64 [8, R] weights (sum k's at k R); int64 [rows, 8] out); variant "base" or "avx2". */
static PyObject *row_sums(PyObject *self, PyObject *args) {
    unsigned long long buf_addr, start_addr, valid_addr, w_addr, out_addr;
    Py_ssize_t buf_len, rows, R;
    const char *variant;
    if (!PyArg_ParseTuple(args, "KnKKnnKKs", &buf_addr, &buf_len, &start_addr, &valid_addr, &rows, &R, &w_addr,
                          &out_addr, &variant))
        return NULL;
    row_fn fn;
    if (strcmp(variant, "base") == 0) {
        fn = row_base;
#ifdef HAVE_AVX2_VARIANT
    } else if (strcmp(variant, "avx2") == 0 && avx2_usable()) {
        fn = row_avx2;
#endif
    } else {
        PyErr_Format(PyExc_ValueError, "row_sums: variant %s is not available here", variant);
        return NULL;
    }
    if (rows < 0 || R <= 0 || R > MAX_ROW || buf_len < 0) {
        PyErr_SetString(PyExc_ValueError, "row_sums: bad sizes");
        return NULL;
    }
    const uint8_t *buf = (const uint8_t *)(uintptr_t)buf_addr;
    const int64_t *start = (const int64_t *)(uintptr_t)start_addr;
    const int64_t *valid = (const int64_t *)(uintptr_t)valid_addr;
    const double *w = (const double *)(uintptr_t)w_addr;
    int64_t *out = (int64_t *)(uintptr_t)out_addr;
    for (Py_ssize_t i = 0; i < rows; i++) {
        if (start[i] < 0 || valid[i] < 0 || valid[i] > 2 * R || start[i] > buf_len - valid[i]) {
            PyErr_Format(PyExc_ValueError, "row_sums: row %zd (start %lld, %lld bytes) is outside the buffer "
                         "(%zd bytes) or longer than a row (%zd bytes)", i, (long long)start[i],
                         (long long)valid[i], buf_len, 2 * R);
            return NULL;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < rows; i++)
        fn((const int8_t *)(buf + start[i]), valid[i] / 2, (int)(valid[i] & 1), w, R, out + SUMS * i);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *variants(PyObject *self, PyObject *noargs) {
    return avx2_usable() ? Py_BuildValue("(ss)", "avx2", "base") : Py_BuildValue("(s)", "base");
}

static PyMethodDef methods[] = {
    {"row_sums", row_sums, METH_VARARGS, "the checksum's row sums of (start, valid) windows of a buffer"},
    {"variants", variants, METH_NOARGS, "the variants this CPU can run, widest first"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rowsums", NULL, -1, methods};

PyMODINIT_FUNC PyInit__rowsums(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "VERSION", 1) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
