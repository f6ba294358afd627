/* Native host path for the forward calls of RMSNorm, SwiGLU and the decode-sized linear, and a generic
 * launcher for every other kernel launch of a kernel module (areal_tik_plugin.runtime.native).
 *
 * One Python -> C call per op call replaces ~20-60 us of Python (argument checks, the kernel module's
 * wrapper, Triton's binder and launcher) with argument reads, one torch.empty and cuLaunchKernelEx of
 * the very CUfunction Triton compiled for that call (same grid, same parameters, same launch options).
 *
 * A call is served here only when a *plan* for it exists. Plans are never written by hand: the first
 * call of a kind goes through the Python path with its launch recorded; learn() then derives the launch
 * from the same inputs with this file's rules and registers a plan only if grid and every kernel
 * parameter equal the recorded ones (and the kernel's specialization flags are the ones assumed here).
 * Anything this file does not handle (a call autograd must track, a tensor subclass, another device, a view the kernel
 * module would copy, an empty tensor, bad input) returns None and the caller takes the Python path,
 * which raises the errors. invalidate() drops every plan (any knob or implementation change).
 *
 * Plain C against the CPython API and cuda.h (Triton's copy); libcuda is opened at the first launch.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include "cuda.h"

#define OP_RMSNORM 1
#define OP_SWIGLU 2
#define MAXP 16
#define NPLANS 128

enum { K_PTR = 0, K_INT = 1, K_F32 = 2 };

typedef struct {
  int kind;
  int spec;          /* ints: specialized on value (==1 -> constexpr, %16); pointers: on 16-byte alignment */
  long long i;       /* int value or pointer */
  double f;
} arg_t;

typedef struct {
  int used, refused, op, variant, dtype, wdtype, device;
  long long size;
  long long cfg[4];
  int n;
  unsigned char cls[MAXP];
  CUfunction fn;
  int num_warps, num_ctas, shared, pdl, coop;
  PyObject *devobj;
  char reason[96];
} plan_t;

static plan_t g_plans[NPLANS];
static long long g_hits, g_misses, g_unsupported;

static PyObject *g_dtypes[3];       /* bf16, fp16, fp32 */
static const int g_esize[3] = {2, 2, 4};
static PyObject *g_tensor_type, *g_param_type;
static PyObject *g_empty, *g_grad_enabled, *g_raw_stream, *g_cur_device;
static PyObject *s_dtype, *s_shape, *s_stride, *s_data_ptr, *s_get_device, *s_requires_grad, *s_kwnames;
static int g_ready;      /* derive / learn usable */
static int g_fast_ready; /* the launch entry points usable (setup(), CUDA torch) */
static int g_cpu_ok;     /* setup_cpu(): derive() accepts CPU tensors (tests) */

typedef CUresult (*launch_ex_t)(const CUlaunchConfig *, CUfunction, void **, void **);
static launch_ex_t g_launch;

/* ---------------------------------------------------------------- tensor reads */

typedef struct {
  PyObject *obj;
  int dtype, device, ndim;
  long long shape[8], stride[8];
  long long ptr;
} tinfo_t;

static int dtype_code(PyObject *dt) {
  for (int i = 0; i < 3; i++)
    if (dt == g_dtypes[i]) return i;
  return -1;
}

static int read_long_tuple(PyObject *tup, long long *out, int max) {
  if (!PyTuple_Check(tup)) return -1;
  Py_ssize_t n = PyTuple_GET_SIZE(tup);
  if (n > max) return -1;
  for (Py_ssize_t i = 0; i < n; i++) {
    long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(tup, i));
    if (v == -1 && PyErr_Occurred()) return -1;
    out[i] = v;
  }
  return (int)n;
}

/* 1: read; 0: not handled here (caller returns None); -1: Python error set. */
static int tread(PyObject *t, tinfo_t *ti, int grad_on) {
  PyTypeObject *tp = Py_TYPE(t);
  if ((PyObject *)tp != g_tensor_type && (PyObject *)tp != g_param_type) return 0;
  ti->obj = t;
  PyObject *o = PyObject_GetAttr(t, s_dtype);
  if (!o) return -1;
  ti->dtype = dtype_code(o);
  Py_DECREF(o);
  if (ti->dtype < 0) return 0;
  if (grad_on) {
    o = PyObject_GetAttr(t, s_requires_grad);
    if (!o) return -1;
    int rg = (o == Py_True);
    Py_DECREF(o);
    if (rg) return 0;
  }
  o = PyObject_CallMethodNoArgs(t, s_get_device);
  if (!o) return -1;
  ti->device = (int)PyLong_AsLong(o);
  Py_DECREF(o);
  if (ti->device < 0 && !(g_cpu_ok && ti->device == -1)) return PyErr_Occurred() ? -1 : 0;
  o = PyObject_GetAttr(t, s_shape);
  if (!o) return -1;
  int n = read_long_tuple(o, ti->shape, 8);
  Py_DECREF(o);
  if (n < 0) return PyErr_Occurred() ? -1 : 0;
  ti->ndim = n;
  o = PyObject_CallMethodNoArgs(t, s_stride);
  if (!o) return -1;
  int m = read_long_tuple(o, ti->stride, 8);
  Py_DECREF(o);
  if (m != n) return PyErr_Occurred() ? -1 : 0;
  o = PyObject_CallMethodNoArgs(t, s_data_ptr);
  if (!o) return -1;
  ti->ptr = PyLong_AsLongLong(o);
  Py_DECREF(o);
  if (ti->ptr == -1 && PyErr_Occurred()) return -1;
  return 1;
}

static long long numel(const tinfo_t *t) {
  long long n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

/* The kernels' _rowops.row_layout: leading dims (size != 1) folded into at most two levels.
 * Returns 0 when they cannot be (the kernel module copies such a view). */
static int row_layout(const tinfo_t *t, long long *M, long long *NH, long long *st, long long *sh) {
  long long mn[8], ms[8];
  int k = 0;
  long long m = 1;
  for (int i = 0; i < t->ndim - 1; i++) {
    m *= t->shape[i];
    if (t->shape[i] == 1) continue;
    if (k && ms[k - 1] == t->stride[i] * t->shape[i]) {
      mn[k - 1] *= t->shape[i];
      ms[k - 1] = t->stride[i];
    } else {
      mn[k] = t->shape[i];
      ms[k] = t->stride[i];
      k++;
    }
  }
  *M = m;
  if (k == 0) { *NH = 1; *st = 0; *sh = 0; return 1; }
  if (k == 1) { *NH = 1; *st = ms[0]; *sh = 0; return 1; }
  if (k == 2) { *NH = mn[1]; *st = ms[0]; *sh = ms[1]; return 1; }
  return 0;
}

/* ---------------------------------------------------------------- classes and plans */

/* Triton 3.6's key for one argument: ints -> i32/i64 and, when specialized, ==1 (a constexpr) or
 * divisible by 16; pointers -> 16-byte aligned or not; floats -> fp32. */
static unsigned char arg_class(const arg_t *a) {
  if (a->kind == K_PTR) return (unsigned char)(a->spec && (a->i % 16 == 0) ? 1 : 0);
  if (a->kind == K_F32) return 0;
  int wide = !(a->i >= -2147483648LL && a->i <= 2147483647LL);
  int v = 0;
  if (a->spec) v = a->i == 1 ? 1 : (a->i % 16 == 0 ? 2 : 3);
  return (unsigned char)(wide * 4 + v);
}

static int is_constexpr(const arg_t *a) { return a->kind == K_INT && a->spec && a->i == 1; }

static plan_t *find_plan(int op, int variant, int dtype, int wdtype, int device, long long size, const arg_t *args,
                         int n) {
  unsigned char cls[MAXP];
  for (int i = 0; i < n; i++) cls[i] = arg_class(&args[i]);
  for (int p = 0; p < NPLANS; p++) {
    plan_t *pl = &g_plans[p];
    if (!pl->used || pl->op != op || pl->variant != variant || pl->dtype != dtype || pl->wdtype != wdtype ||
        pl->device != device || pl->size != size || pl->n != n)
      continue;
    if (memcmp(pl->cls, cls, (size_t)n)) continue;
    return pl;
  }
  return NULL;
}

/* ---------------------------------------------------------------- per-op derivation
 * Inputs are read; outputs are either allocated (launch) or given (learn / derive).
 * Return 1 (derived), 0 (not handled here), -1 (error). */

typedef struct {
  int op, variant, dtype, wdtype, device;
  long long size;
  long long grid[3];
  int n;
  arg_t a[MAXP];
} launch_t;

static void put_ptr(launch_t *L, long long p) { L->a[L->n++] = (arg_t){K_PTR, 1, p, 0}; }
static void put_int(launch_t *L, long long v, int spec) { L->a[L->n++] = (arg_t){K_INT, spec, v, 0}; }
static void put_f32(launch_t *L, double f) { L->a[L->n++] = (arg_t){K_F32, 0, 0, f}; }

static long long vec_for(long long n, int esize) {
  long long v = 16 / esize;
  if (v < 1) v = 1;
  while (v > 1 && n % v) v /= 2;
  return v;
}

/* rmsnorm forward: x [..., H], weight [H], residual like x or absent; y (and res_out) contiguous.
 * cfg: ROWS. (The kernel's VEC is vec_for(H, element size).) */
static int derive_rmsnorm(launch_t *L, const tinfo_t *x, const tinfo_t *w, const tinfo_t *r, double eps,
                          long long y_ptr, long long ro_ptr, long long rows) {
  if (x->ndim < 1 || x->stride[x->ndim - 1] != 1) return 0;
  long long H = x->shape[x->ndim - 1];
  if (H < 1 || numel(x) == 0) return 0;
  if (w->ndim != 1 || w->shape[0] != H || w->stride[0] != 1 || w->device != x->device) return 0;
  if (w->dtype != x->dtype && w->dtype != 2) return 0;
  long long vec = vec_for(H, g_esize[x->dtype]);
  long long M, NH, st, sh, Mr = 0, NHr = 0, srt = 0, srh = 0;
  if (!row_layout(x, &M, &NH, &st, &sh)) return 0;
  if (x->ptr % 16 || st % vec || sh % vec || w->ptr % 16) return 0;
  if (r) {
    if (r->dtype != x->dtype || r->device != x->device || r->ndim != x->ndim) return 0;
    for (int i = 0; i < x->ndim; i++)
      if (r->shape[i] != x->shape[i]) return 0;
    if (r->stride[r->ndim - 1] != 1 || !row_layout(r, &Mr, &NHr, &srt, &srh)) return 0;
    if (NHr != NH || r->ptr % 16 || srt % vec || srh % vec) return 0;
  }
  L->op = OP_RMSNORM;
  L->variant = r != NULL;
  L->dtype = x->dtype;
  L->wdtype = w->dtype;
  L->device = x->device;
  L->size = H;
  L->grid[0] = rows > 0 ? (M + rows - 1) / rows : 0;
  L->grid[1] = L->grid[2] = 1;
  L->n = 0;
  /* X, R, W, Y, RES_OUT, M, NH, sxt, sxh, srt, srh, eps, [W2=None: constexpr], HEADS=1, HEADS1=1 */
  put_ptr(L, x->ptr);
  put_ptr(L, r ? r->ptr : x->ptr);
  put_ptr(L, w->ptr);
  put_ptr(L, y_ptr);
  put_ptr(L, r ? ro_ptr : y_ptr);
  put_int(L, M, 0);
  put_int(L, NH, 0);
  put_int(L, st / vec, 0);
  put_int(L, sh / vec, 0);
  put_int(L, r ? srt / vec : 0, 0);
  put_int(L, r ? srh / vec : 0, 0);
  put_f32(L, eps);
  put_int(L, 1, 0);
  put_int(L, 1, 0);
  return 1;
}

static int rows2(const tinfo_t *t, long long I, long long *M, long long *st) {
  /* the kernel module's x.view(M, I): leading dims folded into one level; torch gives a one-row view
   * the stride I */
  long long NH, sh;
  if (!row_layout(t, M, &NH, st, &sh) || NH != 1) return 0;
  if (*M == 1) *st = I;
  return 1;
}

/* swiglu forward: gate, up [..., I] (last dim contiguous, rows foldable to one stride); out contiguous.
 * cfg: BLOCK. */
static int derive_swiglu(launch_t *L, const tinfo_t *g, long long gptr, const tinfo_t *u, long long uptr,
                         long long I, long long o_ptr, long long block, int fused) {
  long long M, sg, Mu, su;
  if (I < 1 || !rows2(g, I, &M, &sg) || !rows2(u, I, &Mu, &su) || M < 1 || Mu != M) return 0;
  L->op = OP_SWIGLU;
  L->variant = fused;
  L->dtype = g->dtype;
  L->wdtype = u->dtype;
  L->device = g->device;
  L->size = I;
  L->grid[0] = M;
  L->grid[1] = block > 0 ? (I + block - 1) / block : 0;
  L->grid[2] = 1;
  L->n = 0;
  /* G, U, O, sg, su, I (ints specialized) */
  put_ptr(L, gptr);
  put_ptr(L, uptr);
  put_ptr(L, o_ptr);
  put_int(L, sg, 1);
  put_int(L, su, 1);
  put_int(L, I, 1);
  return 1;
}

/* ---------------------------------------------------------------- launch */

static int ensure_driver(void) {
  if (g_launch) return 1;
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    PyErr_SetString(PyExc_RuntimeError, "areal_tik_plugin.runtime.native: cannot open libcuda.so.1");
    return 0;
  }
  g_launch = (launch_ex_t)dlsym(h, "cuLaunchKernelEx");
  if (!g_launch) {
    PyErr_SetString(PyExc_RuntimeError, "areal_tik_plugin.runtime.native: libcuda.so.1 has no cuLaunchKernelEx");
    return 0;
  }
  return 1;
}

/* The current torch stream of ``device`` (torch._C._cuda_getCurrentRawStream). 1: read; 0: error set. */
static int cur_stream(int device, unsigned long long *out) {
  PyObject *idx = PyLong_FromLong(device);
  if (!idx) return 0;
  PyObject *so = PyObject_CallOneArg(g_raw_stream, idx);
  Py_DECREF(idx);
  if (!so) return 0;
  *out = PyLong_AsUnsignedLongLong(so);
  Py_DECREF(so);
  return !PyErr_Occurred();
}

/* cuLaunchKernelEx with Triton's launch options: 32 * num_warps threads, dynamic shared memory, PDL and
 * cooperative attributes as the compiled kernel's metadata says. 1: launched; 0: error set. */
static int cu_launch(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, int num_warps, int shared, int pdl,
                     int coop, CUstream stream, void **params) {
  CUlaunchAttribute attrs[2];
  CUlaunchConfig cfg;
  memset(&cfg, 0, sizeof cfg);
  memset(attrs, 0, sizeof attrs);
  cfg.gridDimX = gx;
  cfg.gridDimY = gy;
  cfg.gridDimZ = gz;
  cfg.blockDimX = 32u * (unsigned)num_warps;
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.sharedMemBytes = (unsigned)shared;
  cfg.hStream = stream;
  cfg.attrs = attrs;
  int na = 0;
  if (pdl) {
    attrs[na].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[na].value.programmaticStreamSerializationAllowed = 1;
    na++;
  }
  if (coop) {
    attrs[na].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[na].value.cooperative = 1;
    na++;
  }
  cfg.numAttrs = (unsigned)na;
  CUresult rc = g_launch(&cfg, fn, params, NULL);
  if (rc != CUDA_SUCCESS) {
    PyErr_Format(PyExc_RuntimeError, "areal_tik_plugin.runtime.native: cuLaunchKernelEx failed (CUresult %d)", (int)rc);
    return 0;
  }
  return 1;
}

static int launch_plan(const plan_t *pl, const launch_t *L) {
  if (L->grid[0] * L->grid[1] * L->grid[2] == 0) return 1;
  if (!ensure_driver()) return 0;
  unsigned long long stream;
  if (!cur_stream(pl->device, &stream)) return 0;
  unsigned long long pv[MAXP];
  void *params[MAXP + 2];
  unsigned long long zero0 = 0, zero1 = 0;
  int np = 0;
  for (int i = 0; i < L->n; i++) {
    const arg_t *a = &L->a[i];
    if (is_constexpr(a)) continue;
    pv[i] = 0;
    if (a->kind == K_PTR) {
      pv[i] = (unsigned long long)a->i;
    } else if (a->kind == K_F32) {
      float f = (float)a->f;
      memcpy(&pv[i], &f, sizeof f);
    } else if (arg_class(a) >= 4) {
      int64_t v = (int64_t)a->i;
      memcpy(&pv[i], &v, sizeof v);
    } else {
      int32_t v = (int32_t)a->i;
      memcpy(&pv[i], &v, sizeof v);
    }
    params[np++] = &pv[i];
  }
  params[np++] = &zero0; /* global_scratch (plans require size 0) */
  params[np++] = &zero1; /* profile_scratch (size 0) */
  return cu_launch(pl->fn, (unsigned)(L->grid[0] * pl->num_ctas), (unsigned)L->grid[1], (unsigned)L->grid[2],
                   pl->num_warps, pl->shared, pl->pdl, pl->coop, (CUstream)(uintptr_t)stream, params);
}

/* torch.empty(shape, dtype=..., device=...) */
static PyObject *empty(PyObject *shape, int dtype, PyObject *devobj) {
  PyObject *args[3] = {shape, g_dtypes[dtype], devobj};
  return PyObject_Vectorcall(g_empty, args, 1, s_kwnames);
}

static PyObject *shape_tuple(const tinfo_t *t, long long last) {
  PyObject *tup = PyTuple_New(t->ndim);
  if (!tup) return NULL;
  for (int i = 0; i < t->ndim; i++) {
    PyObject *v = PyLong_FromLongLong(i == t->ndim - 1 ? last : t->shape[i]);
    if (!v) { Py_DECREF(tup); return NULL; }
    PyTuple_SET_ITEM(tup, i, v);
  }
  return tup;
}

static int grad_on(void) {
  PyObject *o = PyObject_CallNoArgs(g_grad_enabled);
  if (!o) return -1;
  int on = (o == Py_True);
  Py_DECREF(o);
  return on;
}

static int cur_device(void) {
  PyObject *o = PyObject_CallNoArgs(g_cur_device);
  if (!o) return -2;
  int d = (int)PyLong_AsLong(o);
  Py_DECREF(o);
  return d;
}

#define NOT_HANDLED() do { g_unsupported++; Py_RETURN_NONE; } while (0)
#define MISS() do { g_misses++; Py_RETURN_FALSE; } while (0)

static int read_eps(PyObject *o, double *eps) {
  if (!PyFloat_CheckExact(o)) return 0;
  double e = PyFloat_AS_DOUBLE(o);
  if (!(e > 0.0) || e == Py_HUGE_VAL) return 0;
  *eps = e;
  return 1;
}

/* Result: the outputs; None: not handled here; False: no plan (the caller learns). */
static PyObject *py_rmsnorm(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (!g_fast_ready || nargs != 4) NOT_HANDLED();
  int go = grad_on();
  if (go < 0) return NULL;
  tinfo_t x, w, r;
  int has_r = args[3] != Py_None;
  int k;
  double eps;
  if ((k = tread(args[0], &x, go)) <= 0 || (k = tread(args[1], &w, go)) <= 0 ||
      (has_r && (k = tread(args[3], &r, go)) <= 0)) {
    if (k < 0) return NULL;
    NOT_HANDLED();
  }
  if (!read_eps(args[2], &eps)) NOT_HANDLED();
  launch_t L;
  /* outputs are contiguous and fresh (16-byte aligned by the caching allocator: checked below) */
  if (derive_rmsnorm(&L, &x, &w, has_r ? &r : NULL, eps, 0, 0, 1) <= 0) NOT_HANDLED();
  plan_t *pl = NULL;
  L.a[3].i = L.a[4].i = 16; /* placeholder aligned pointers for the lookup */
  if (!has_r) L.a[1].i = x.ptr;
  {
    int d = cur_device();
    if (d == -2) return NULL;
    if (d != x.device) NOT_HANDLED();
  }
  pl = find_plan(L.op, L.variant, L.dtype, L.wdtype, L.device, L.size, L.a, L.n);
  if (!pl) MISS();
  if (pl->refused) NOT_HANDLED();
  PyObject *shape = PyObject_GetAttr(args[0], s_shape);
  if (!shape) return NULL;
  PyObject *y = empty(shape, x.dtype, pl->devobj);
  PyObject *ro = (y && has_r) ? empty(shape, x.dtype, pl->devobj) : NULL;
  Py_DECREF(shape);
  if (!y || (has_r && !ro)) { Py_XDECREF(y); Py_XDECREF(ro); return NULL; }
  tinfo_t yi, ri;
  int ok = tread(y, &yi, 0) > 0 && (!has_r || tread(ro, &ri, 0) > 0);
  if (!ok || yi.ptr % 16 || (has_r && ri.ptr % 16)) {
    Py_DECREF(y); Py_XDECREF(ro);
    if (PyErr_Occurred()) return NULL;
    NOT_HANDLED();
  }
  derive_rmsnorm(&L, &x, &w, has_r ? &r : NULL, eps, yi.ptr, has_r ? ri.ptr : 0, pl->cfg[0]);
  if (!launch_plan(pl, &L)) { Py_DECREF(y); Py_XDECREF(ro); return NULL; }
  g_hits++;
  if (!has_r) return y;
  PyObject *out = PyTuple_Pack(2, y, ro);
  Py_DECREF(y);
  Py_DECREF(ro);
  return out;
}

/* swiglu(gate, up) and swiglu_fused(gate_up): result tensor / None / False as above. */
static PyObject *swiglu_common(PyObject *const *args, int fused) {
  int go = grad_on();
  if (go < 0) return NULL;
  tinfo_t g, u;
  int k;
  if ((k = tread(args[0], &g, go)) <= 0 || (!fused && (k = tread(args[1], &u, go)) <= 0)) {
    if (k < 0) return NULL;
    NOT_HANDLED();
  }
  if (g.ndim < 1 || g.stride[g.ndim - 1] != 1 || numel(&g) == 0) NOT_HANDLED();
  long long I, uptr;
  if (fused) {
    if (g.shape[g.ndim - 1] % 2) NOT_HANDLED();
    I = g.shape[g.ndim - 1] / 2;
    u = g;
    uptr = g.ptr + I * g_esize[g.dtype];
  } else {
    I = g.shape[g.ndim - 1];
    if (u.dtype != g.dtype || u.device != g.device || u.ndim != g.ndim || u.stride[u.ndim - 1] != 1) NOT_HANDLED();
    for (int i = 0; i < g.ndim; i++)
      if (u.shape[i] != g.shape[i]) NOT_HANDLED();
    uptr = u.ptr;
  }
  {
    int d = cur_device();
    if (d == -2) return NULL;
    if (d != g.device) NOT_HANDLED();
  }
  launch_t L;
  if (derive_swiglu(&L, &g, g.ptr, &u, uptr, I, 16, 1, fused) <= 0) NOT_HANDLED();
  plan_t *pl = find_plan(L.op, L.variant, L.dtype, L.wdtype, L.device, L.size, L.a, L.n);
  if (!pl) MISS();
  if (pl->refused) NOT_HANDLED();
  PyObject *shape = shape_tuple(&g, I);
  if (!shape) return NULL;
  PyObject *o = empty(shape, g.dtype, pl->devobj);
  Py_DECREF(shape);
  if (!o) return NULL;
  tinfo_t oi;
  if (tread(o, &oi, 0) <= 0 || oi.ptr % 16) {
    Py_DECREF(o);
    if (PyErr_Occurred()) return NULL;
    NOT_HANDLED();
  }
  derive_swiglu(&L, &g, g.ptr, &u, uptr, I, oi.ptr, pl->cfg[0], fused);
  if (!launch_plan(pl, &L)) { Py_DECREF(o); return NULL; }
  g_hits++;
  return o;
}

static PyObject *py_swiglu(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (!g_fast_ready || nargs != 2) NOT_HANDLED();
  return swiglu_common(args, 0);
}

static PyObject *py_swiglu_fused(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (!g_fast_ready || nargs != 1) NOT_HANDLED();
  return swiglu_common(args, 1);
}


/* ---------------------------------------------------------------- host TMA descriptors */

/* the parameter kinds of a launch, as gderive / linear_derive report them (runtime/native/launch.py) */
enum { GP_DROP = 0, GP_PTR, GP_I32, GP_I64, GP_F32, GP_I8, GP_DESC };

typedef struct {
  int rank, swizzle, elem_size, elem_type, padding;
  unsigned block[5];
} gdesc_t;

typedef CUresult (*encode_t)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                             const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                             CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static encode_t g_encode;

static int ensure_encode(void) {
  if (g_encode) return 1;
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h) g_encode = (encode_t)dlsym(h, "cuTensorMapEncodeTiled");
  if (!g_encode) {
    PyErr_SetString(PyExc_RuntimeError, "areal_tik_plugin.runtime.native: no cuTensorMapEncodeTiled in libcuda.so.1");
    return 0;
  }
  return 1;
}

/* One host TMA descriptor encoded exactly as Triton's fill_tma_descriptor does (row-major shape and
 * element strides of the tensor, the kernel's block, swizzle and element type). 1, or 0 with an error set. */
static int encode_map(CUtensorMap *map, const gdesc_t *d, unsigned long long ptr, const long long *shape,
                      const long long *stride) {
  cuuint64_t dims[5] = {0}, strides[5] = {0};
  cuuint32_t box[5], es[5] = {1, 1, 1, 1, 1};
  int r = d->rank;
  for (int j = 0; j < r; j++) {
    box[r - j - 1] = d->block[j];
    dims[r - j - 1] = (cuuint64_t)shape[j];
  }
  for (int j = 0; j + 1 < r; j++) strides[r - j - 2] = (cuuint64_t)(d->elem_size * stride[j]);
  strides[r - 1] = dims[r - 1] * (r == 1 ? (cuuint64_t)d->elem_size : strides[r - 2]);
  if (!ensure_encode()) return 0;
  CUresult rc = g_encode(map, (CUtensorMapDataType)d->elem_type, (cuuint32_t)r, (void *)(uintptr_t)ptr, dims, strides,
                         box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, (CUtensorMapSwizzle)d->swizzle,
                         CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                         d->padding ? CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA : CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (rc != CUDA_SUCCESS) {
    PyErr_Format(PyExc_RuntimeError, "areal_tik_plugin.runtime.native: cuTensorMapEncodeTiled failed (CUresult %d)", (int)rc);
    return 0;
  }
  return 1;
}


/* Derived launch parameters as Python: [(kind, value)] (descriptor: (GP_DESC, its 128 bytes) when
 * ``encode``, else (GP_DESC, None); floats as their fp32 bit pattern) -- gderive's and linear_derive's form,
 * compared with runtime/native/launch.expected. */
static PyObject *derived_list(int np, const int *kinds, const unsigned long long *pv, const CUtensorMap *maps,
                              int encode) {
  PyObject *out = PyList_New(np);
  if (!out) return NULL;
  for (int i = 0; i < np; i++) {
    PyObject *val;
    switch (kinds[i]) {
      case GP_DESC: val = encode ? PyBytes_FromStringAndSize((const char *)&maps[pv[i]], sizeof(CUtensorMap)) : Py_NewRef(Py_None); break;
      case GP_I32: { int32_t q; memcpy(&q, &pv[i], 4); val = PyLong_FromLong(q); break; }
      case GP_F32: { uint32_t q; memcpy(&q, &pv[i], 4); val = PyLong_FromUnsignedLong(q); break; }
      case GP_I8: { int8_t q; memcpy(&q, &pv[i], 1); val = PyLong_FromLong(q); break; }
      case GP_I64: val = PyLong_FromLongLong((long long)pv[i]); break;
      default: val = PyLong_FromUnsignedLongLong(pv[i]);
    }
    PyObject *t = val ? Py_BuildValue("(iN)", kinds[i], val) : NULL;
    if (!t) { Py_DECREF(out); return NULL; }
    PyList_SET_ITEM(out, i, t);
  }
  return out;
}


/* ---------------------------------------------------------------- linear (recipes)
 * The GEMM's configuration is a function of (M, N, K) and its integer arguments are those sizes and the
 * row strides, so a plan for one exact (M, N, K, strides, alignments, bias) is a *recipe*: each kernel
 * parameter is an input's pointer, the output's, a temporary's (allocated per call), a fixed buffer's
 * (the split reduce's tickets, bound to the stream it was learned on) or a constant. The recipe is read
 * off the recorded launch by learn_linear(); C substitutes this call's pointers and encodes the TMA maps
 * of its operands, and runtime/native checks what it derives (linear_derive) against Triton's parameters
 * at that first call. */

enum { R_X = 0, R_W, R_B, R_Y, R_TMP, R_FIXED, R_I32, R_I64, R_F32, R_DESC };
#define LIN_SLOTS 1024
#define LIN_MAXT 2
#define LIN_MAXP 32 /* a TMA GEMM passes 3 descriptors (map, 2 sizes, 2 strides each), the bias and M, N, K */
#define LIN_MAXD 3

/* R_DESC: a host TMA descriptor over operand ``op`` (R_X / R_W / R_Y) at its full extent; its shape and
 * strides are the recipe's (M, N, K and the row strides are part of its key), only the base pointer is
 * this call's, so the map is encoded per call. The sizes and strides Triton passes after each map are
 * recipe constants (R_I32 / R_I64). */
typedef struct {
  int op;
  gdesc_t d;
  long long shape[2], stride[2];
} ldesc_t;

typedef struct {
  int used, refused, dtype, bdtype, device, align; /* align: bits x, w, b 16-byte aligned */
  long long M, N, K, sx, sw;
  long long grid[3];
  int n;
  unsigned char kind[LIN_MAXP];
  long long val[LIN_MAXP];
  int nld;
  ldesc_t ld[LIN_MAXD];
  int ntmp;
  long long tshape[LIN_MAXT][3];
  int tndim[LIN_MAXT], tdtype[LIN_MAXT];
  unsigned long long stream; /* 0: any stream; else the only stream the recipe's fixed buffers serve */
  CUfunction fn;
  int num_warps, shared, pdl;
  PyObject *devobj;
} lplan_t;

static lplan_t g_lin[LIN_SLOTS];
static int g_lin_count;

static unsigned long long lin_hash(int dtype, int bdtype, int device, int align, long long M, long long N, long long K,
                                   long long sx, long long sw) {
  unsigned long long h = 1469598103934665603ULL;
  long long v[9] = {dtype, bdtype, device, align, M, N, K, sx, sw};
  for (int i = 0; i < 9; i++) { h ^= (unsigned long long)v[i]; h *= 1099511628211ULL; }
  return h;
}

static lplan_t *lin_find(int dtype, int bdtype, int device, int align, long long M, long long N, long long K, long long sx,
                         long long sw, int create) {
  unsigned long long h = lin_hash(dtype, bdtype, device, align, M, N, K, sx, sw);
  for (int probe = 0; probe < LIN_SLOTS; probe++) {
    lplan_t *p = &g_lin[(h + (unsigned long long)probe) % LIN_SLOTS];
    if (!p->used) {
      if (!create) return NULL;
      if (g_lin_count * 4 >= LIN_SLOTS * 3) return NULL; /* full: the caller clears the table */
      memset(p, 0, sizeof *p);
      p->used = 1; p->dtype = dtype; p->bdtype = bdtype; p->device = device; p->align = align;
      p->M = M; p->N = N; p->K = K; p->sx = sx; p->sw = sw;
      g_lin_count++;
      return p;
    }
    if (p->dtype == dtype && p->bdtype == bdtype && p->device == device && p->align == align && p->M == M &&
        p->N == N && p->K == K && p->sx == sx && p->sw == sw)
      return p;
  }
  return NULL;
}

static void lin_clear(void) {
  for (int i = 0; i < LIN_SLOTS; i++) {
    Py_CLEAR(g_lin[i].devobj);
    g_lin[i].used = 0;
  }
  g_lin_count = 0;
}

typedef struct { tinfo_t x, w, b; int has_b, align, bdtype; } lin_in_t;

/* 1 read, 0 not handled, -1 error */
static int lin_read(PyObject *const *args, int go, lin_in_t *in) {
  int k;
  in->has_b = args[2] != Py_None;
  if ((k = tread(args[0], &in->x, go)) <= 0 || (k = tread(args[1], &in->w, go)) <= 0 ||
      (in->has_b && (k = tread(args[2], &in->b, go)) <= 0))
    return k;
  tinfo_t *x = &in->x, *w = &in->w;
  if (x->ndim != 2 || w->ndim != 2 || x->stride[1] != 1 || w->stride[1] != 1 || x->dtype == 2 || w->dtype != x->dtype)
    return 0;
  if (x->shape[0] < 1 || x->shape[1] != w->shape[1] || w->shape[0] < 1 || w->stride[0] < w->shape[1]) return 0;
  if (w->device != x->device) return 0;
  in->bdtype = -1;
  if (in->has_b) {
    tinfo_t *b = &in->b;
    if (b->ndim != 1 || b->shape[0] != w->shape[0] || b->stride[0] != 1 || b->device != x->device) return 0;
    if (b->dtype != x->dtype && b->dtype != 2) return 0;
    in->bdtype = b->dtype;
  }
  in->align = (x->ptr % 16 == 0) | ((w->ptr % 16 == 0) << 1) | ((!in->has_b || in->b.ptr % 16 == 0) << 2);
  return 1;
}

/* This call's kernel parameters under the recipe: pv / params filled (maps encoded when ``encode``), kinds
 * in gderive's terms (GP_*). Returns the count, or -1 with an error set. */
static int lin_fill(const lplan_t *pl, const lin_in_t *in, long long yptr, const long long *tptr, unsigned long long *pv,
                    void **params, CUtensorMap *maps, int *kinds, int encode) {
  for (int i = 0; i < pl->n; i++) {
    long long v = pl->val[i];
    kinds[i] = GP_PTR;
    switch (pl->kind[i]) {
      case R_X: pv[i] = (unsigned long long)(in->x.ptr + v); break;
      case R_W: pv[i] = (unsigned long long)(in->w.ptr + v); break;
      case R_B: pv[i] = (unsigned long long)(in->b.ptr + v); break;
      case R_Y: pv[i] = (unsigned long long)(yptr + v); break;
      case R_TMP: pv[i] = (unsigned long long)tptr[v]; break;
      case R_FIXED: pv[i] = (unsigned long long)v; break;
      case R_I32: { int32_t q = (int32_t)v; pv[i] = 0; memcpy(&pv[i], &q, sizeof q); kinds[i] = GP_I32; break; }
      case R_I64: pv[i] = (unsigned long long)v; kinds[i] = GP_I64; break;
      case R_F32: { float f; double dd; memcpy(&dd, &v, sizeof dd); f = (float)dd; pv[i] = 0; memcpy(&pv[i], &f, sizeof f);
                    kinds[i] = GP_F32; break; }
      case R_DESC: {
        const ldesc_t *L = &pl->ld[v];
        long long base = L->op == R_X ? in->x.ptr : L->op == R_W ? in->w.ptr : yptr;
        memset(&maps[v], 0, sizeof maps[v]);
        if (encode && !encode_map(&maps[v], &L->d, (unsigned long long)base, L->shape, L->stride)) return -1;
        pv[i] = (unsigned long long)v;
        kinds[i] = GP_DESC;
        params[i] = &maps[v];
        continue;
      }
      default: PyErr_SetString(PyExc_RuntimeError, "linear: bad recipe parameter kind"); return -1;
    }
    params[i] = &pv[i];
  }
  return pl->n;
}

static PyObject *py_linear(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (!g_fast_ready || nargs != 3) NOT_HANDLED();
  int go = grad_on();
  if (go < 0) return NULL;
  lin_in_t in;
  int k = lin_read(args, go, &in);
  if (k < 0) return NULL;
  if (k == 0) NOT_HANDLED();
  {
    int d = cur_device();
    if (d == -2) return NULL;
    if (d != in.x.device) NOT_HANDLED();
  }
  long long M = in.x.shape[0], K = in.x.shape[1], N = in.w.shape[0];
  lplan_t *pl = lin_find(in.x.dtype, in.bdtype, in.x.device, in.align, M, N, K, in.x.stride[0], in.w.stride[0], 0);
  if (!pl || !pl->n) MISS();
  if (pl->refused) NOT_HANDLED();
  unsigned long long stream;
  if (!cur_stream(pl->device, &stream)) return NULL;
  if (pl->stream && pl->stream != stream) NOT_HANDLED();
  if (!ensure_driver()) return NULL;
  PyObject *yshape = Py_BuildValue("(LL)", M, N);
  if (!yshape) return NULL;
  PyObject *y = empty(yshape, in.x.dtype, pl->devobj);
  Py_DECREF(yshape);
  if (!y) return NULL;
  PyObject *tmps[LIN_MAXT] = {NULL, NULL};
  long long tptr[LIN_MAXT] = {0, 0}, yptr;
  tinfo_t ti;
  if (tread(y, &ti, 0) <= 0) goto fail;
  yptr = ti.ptr;
  if (yptr % 16) goto unaligned;
  for (int t = 0; t < pl->ntmp; t++) {
    PyObject *sh = PyTuple_New(pl->tndim[t]);
    if (!sh) goto fail;
    for (int d = 0; d < pl->tndim[t]; d++) PyTuple_SET_ITEM(sh, d, PyLong_FromLongLong(pl->tshape[t][d]));
    tmps[t] = empty(sh, pl->tdtype[t], pl->devobj);
    Py_DECREF(sh);
    if (!tmps[t] || tread(tmps[t], &ti, 0) <= 0) goto fail;
    tptr[t] = ti.ptr;
    if (tptr[t] % 16) goto unaligned;
  }
  {
    unsigned long long pv[LIN_MAXP];
    void *params[LIN_MAXP + 2];
    int kinds[LIN_MAXP];
    CUtensorMap maps[LIN_MAXD];
    unsigned long long z0 = 0, z1 = 0;
    if (lin_fill(pl, &in, yptr, tptr, pv, params, maps, kinds, 1) < 0) goto fail;
    params[pl->n] = &z0;
    params[pl->n + 1] = &z1;
    if (!cu_launch(pl->fn, (unsigned)pl->grid[0], (unsigned)pl->grid[1], (unsigned)pl->grid[2], pl->num_warps,
                   pl->shared, pl->pdl, 0, (CUstream)(uintptr_t)stream, params))
      goto fail;
  }
  for (int t = 0; t < LIN_MAXT; t++) Py_XDECREF(tmps[t]); /* the caching allocator keeps stream order */
  g_hits++;
  return y;
unaligned: /* the recipe was learned on 16-byte aligned outputs: leave this call to the Python path */
  Py_XDECREF(y);
  for (int t = 0; t < LIN_MAXT; t++) Py_XDECREF(tmps[t]);
  NOT_HANDLED();
fail:
  Py_XDECREF(y);
  for (int t = 0; t < LIN_MAXT; t++) Py_XDECREF(tmps[t]);
  return NULL;
}

/* learn_linear(x, weight, bias|None, recipe|None, reason|None) -> None
 * recipe: (grid (3 ints), [(kind, value)], [(shape tuple, dtype code)], stream, fn, num_warps, shared, pdl,
 * device_obj); None with a reason: the kind is refused (kept on the Python path). */
static PyObject *py_learn_linear(PyObject *self, PyObject *args) {
  PyObject *x, *w, *b, *recipe;
  const char *reason = NULL;
  if (!g_ready) {
    PyErr_SetString(PyExc_RuntimeError, "areal_tik_plugin.runtime.native: setup() has not run");
    return NULL;
  }
  if (!PyArg_ParseTuple(args, "OOOO|z", &x, &w, &b, &recipe, &reason)) return NULL;
  PyObject *a3[3] = {x, w, b};
  lin_in_t in;
  int k = lin_read(a3, 0, &in);
  if (k < 0) return NULL;
  if (k == 0) Py_RETURN_FALSE;
  long long M = in.x.shape[0], K = in.x.shape[1], N = in.w.shape[0];
  lplan_t *pl = lin_find(in.x.dtype, in.bdtype, in.x.device, in.align, M, N, K, in.x.stride[0], in.w.stride[0], 1);
  if (!pl) {
    lin_clear();
    pl = lin_find(in.x.dtype, in.bdtype, in.x.device, in.align, M, N, K, in.x.stride[0], in.w.stride[0], 1);
    if (!pl) Py_RETURN_FALSE;
  }
  if (recipe == Py_None) {
    pl->refused = 1;
    pl->n = 1;
    Py_RETURN_FALSE;
  }
  PyObject *params, *temps, *devobj;
  unsigned long long stream, fn;
  int nw, shm, pdl;
  if (!PyArg_ParseTuple(recipe, "(LLL)OOKKiipO", &pl->grid[0], &pl->grid[1], &pl->grid[2], &params, &temps, &stream,
                        &fn, &nw, &shm, &pdl, &devobj))
    goto bad;
  if (!PyList_Check(params) || PyList_GET_SIZE(params) > LIN_MAXP || !PyList_Check(temps) ||
      PyList_GET_SIZE(temps) > LIN_MAXT) {
    PyErr_SetString(PyExc_ValueError, "learn_linear: params (<= 32) and temps (<= 2) must be lists");
    goto bad;
  }
  pl->n = (int)PyList_GET_SIZE(params);
  pl->nld = 0;
  for (int i = 0; i < pl->n; i++) {
    int kind;
    PyObject *v;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(params, i), "iO", &kind, &v)) goto bad;
    if (kind < R_X || kind > R_DESC) {
      PyErr_Format(PyExc_ValueError, "learn_linear: unknown parameter kind %d", kind);
      goto bad;
    }
    pl->kind[i] = (unsigned char)kind;
    if (kind == R_DESC) {
      ldesc_t *L;
      if (pl->nld == LIN_MAXD) {
        PyErr_SetString(PyExc_ValueError, "learn_linear: at most 3 tensor descriptors");
        goto bad;
      }
      L = &pl->ld[pl->nld];
      memset(L, 0, sizeof *L);
      L->d.rank = 2;
      if (!PyArg_ParseTuple(v, "iiiii(II)(LL)(LL)", &L->op, &L->d.swizzle, &L->d.elem_size, &L->d.elem_type,
                            &L->d.padding, &L->d.block[0], &L->d.block[1], &L->shape[0], &L->shape[1], &L->stride[0],
                            &L->stride[1]))
        goto bad;
      if (L->op != R_X && L->op != R_W && L->op != R_Y) {
        PyErr_SetString(PyExc_ValueError, "learn_linear: a descriptor is over x, weight or the output");
        goto bad;
      }
      pl->val[i] = pl->nld++;
    } else if (kind == R_F32) {
      double d = PyFloat_AsDouble(v);
      memcpy(&pl->val[i], &d, sizeof d);
    } else {
      pl->val[i] = PyLong_AsLongLong(v);
    }
    if (PyErr_Occurred()) goto bad;
  }
  pl->ntmp = (int)PyList_GET_SIZE(temps);
  for (int t = 0; t < pl->ntmp; t++) {
    PyObject *sh;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(temps, t), "Oi", &sh, &pl->tdtype[t]) || !PyTuple_Check(sh) ||
        PyTuple_GET_SIZE(sh) > 3 || pl->tdtype[t] < 0 || pl->tdtype[t] > 2) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "learn_linear: a temp is (shape <= 3 dims, dtype code)");
      goto bad;
    }
    pl->tndim[t] = (int)PyTuple_GET_SIZE(sh);
    for (int d = 0; d < pl->tndim[t]; d++) pl->tshape[t][d] = PyLong_AsLongLong(PyTuple_GET_ITEM(sh, d));
    if (PyErr_Occurred()) goto bad;
  }
  pl->stream = stream;
  pl->fn = (CUfunction)(uintptr_t)fn;
  pl->num_warps = nw;
  pl->shared = shm;
  pl->pdl = pdl;
  Py_INCREF(devobj);
  Py_XSETREF(pl->devobj, devobj);
  pl->refused = 0;
  Py_RETURN_TRUE;
bad:
  pl->n = 0; /* an unusable recipe: no plan */
  return NULL;
}

/* linear_derive(x, weight, bias|None, y, temps: tuple, encode) -> None (no recipe) or [(kind, value)]: the
 * parameters linear() would pass with ``y`` and ``temps`` as its output and temporaries, in gderive's form
 * (descriptor: (GP_DESC, 128 bytes) when encode, else (GP_DESC, None); floats as their fp32 bit pattern). */
static PyObject *py_linear_derive(PyObject *self, PyObject *args) {
  PyObject *x, *w, *b, *y, *temps;
  int encode = 1;
  if (!g_ready) {
    PyErr_SetString(PyExc_RuntimeError, "areal_tik_plugin.runtime.native: setup() has not run");
    return NULL;
  }
  if (!PyArg_ParseTuple(args, "OOOOO!|p", &x, &w, &b, &y, &PyTuple_Type, &temps, &encode)) return NULL;
  PyObject *a3[3] = {x, w, b};
  lin_in_t in;
  int k = lin_read(a3, 0, &in);
  if (k < 0) return NULL;
  if (k == 0) Py_RETURN_NONE;
  long long M = in.x.shape[0], K = in.x.shape[1], N = in.w.shape[0];
  lplan_t *pl = lin_find(in.x.dtype, in.bdtype, in.x.device, in.align, M, N, K, in.x.stride[0], in.w.stride[0], 0);
  if (!pl || !pl->n || pl->refused) Py_RETURN_NONE;
  tinfo_t ti;
  if (tread(y, &ti, 0) <= 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "linear_derive: y must be a tensor");
    return NULL;
  }
  long long yptr = ti.ptr, tptr[LIN_MAXT] = {0, 0};
  if (PyTuple_GET_SIZE(temps) != pl->ntmp) {
    PyErr_Format(PyExc_ValueError, "linear_derive: the recipe has %d temporaries", pl->ntmp);
    return NULL;
  }
  for (int t = 0; t < pl->ntmp; t++) {
    if (tread(PyTuple_GET_ITEM(temps, t), &ti, 0) <= 0) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "linear_derive: temporaries must be tensors");
      return NULL;
    }
    tptr[t] = ti.ptr;
  }
  unsigned long long pv[LIN_MAXP];
  void *params[LIN_MAXP + 2];
  int kinds[LIN_MAXP];
  CUtensorMap maps[LIN_MAXD];
  int np = lin_fill(pl, &in, yptr, tptr, pv, params, maps, kinds, encode);
  if (np < 0) return NULL;
  return derived_list(np, kinds, pv, maps, encode);
}

static PyObject *lin_stats(void) {
  int n = 0, refused = 0;
  for (int i = 0; i < LIN_SLOTS; i++)
    if (g_lin[i].used && g_lin[i].n) { n++; refused += g_lin[i].refused; }
  return Py_BuildValue("{s:i,s:i}", "plans", n, "refused", refused);
}

/* ---------------------------------------------------------------- derive / learn */

/* derive(op, inputs: tuple, outputs: tuple, cfg: int) -> (grid, [(kind, spec, value), ...]) or None.
 * op: "rmsnorm" (inputs (x, weight, eps, residual|None), outputs (y[, res_out])),
 *     "swiglu" (inputs (gate, up)), "swiglu_fused" (inputs (gate_up,)), outputs (out,). */
static int derive_any(const char *op, PyObject *inputs, PyObject *outputs, long long cfg, launch_t *L) {
  if (!PyTuple_Check(inputs) || !PyTuple_Check(outputs)) {
    PyErr_SetString(PyExc_TypeError, "derive: inputs and outputs must be tuples");
    return -1;
  }
  tinfo_t a, b, c, o1, o2;
  Py_ssize_t ni = PyTuple_GET_SIZE(inputs), no = PyTuple_GET_SIZE(outputs);
  int k;
  if (!strcmp(op, "rmsnorm")) {
    if (ni != 4 || no < 1) return 0;
    PyObject *res = PyTuple_GET_ITEM(inputs, 3);
    int has_r = res != Py_None;
    double eps;
    if ((k = tread(PyTuple_GET_ITEM(inputs, 0), &a, 0)) <= 0 || (k = tread(PyTuple_GET_ITEM(inputs, 1), &b, 0)) <= 0 ||
        (has_r && (k = tread(res, &c, 0)) <= 0) || (k = tread(PyTuple_GET_ITEM(outputs, 0), &o1, 0)) <= 0 ||
        (has_r && (no < 2 || (k = tread(PyTuple_GET_ITEM(outputs, 1), &o2, 0)) <= 0)))
      return k < 0 ? -1 : 0;
    if (!read_eps(PyTuple_GET_ITEM(inputs, 2), &eps)) return 0;
    return derive_rmsnorm(L, &a, &b, has_r ? &c : NULL, eps, o1.ptr, has_r ? o2.ptr : 0, cfg);
  }
  int fused = !strcmp(op, "swiglu_fused");
  if (fused || !strcmp(op, "swiglu")) {
    if (ni != (fused ? 1 : 2) || no != 1) return 0;
    if ((k = tread(PyTuple_GET_ITEM(inputs, 0), &a, 0)) <= 0 || (!fused && (k = tread(PyTuple_GET_ITEM(inputs, 1), &b, 0)) <= 0) ||
        (k = tread(PyTuple_GET_ITEM(outputs, 0), &o1, 0)) <= 0)
      return k < 0 ? -1 : 0;
    if (a.ndim < 1) return 0;
    long long I = fused ? a.shape[a.ndim - 1] / 2 : a.shape[a.ndim - 1];
    return derive_swiglu(L, &a, a.ptr, fused ? &a : &b, fused ? a.ptr + I * g_esize[a.dtype] : b.ptr, I, o1.ptr, cfg,
                         fused);
  }
  PyErr_Format(PyExc_ValueError, "derive: unknown op %s (expected rmsnorm, swiglu, swiglu_fused)", op);
  return -1;
}

static PyObject *launch_to_py(const launch_t *L) {
  PyObject *lst = PyList_New(0);
  if (!lst) return NULL;
  for (int i = 0; i < L->n; i++) {
    const arg_t *x = &L->a[i];
    PyObject *v = x->kind == K_F32 ? PyFloat_FromDouble(x->f) : PyLong_FromLongLong(x->i);
    const char *kind = x->kind == K_PTR ? "ptr" : (x->kind == K_F32 ? "fp32" : (arg_class(x) >= 4 ? "i64" : "i32"));
    PyObject *item = Py_BuildValue("(sOOi)", kind, v, is_constexpr(x) ? Py_True : Py_False, (int)arg_class(x));
    Py_XDECREF(v);
    if (!item || PyList_Append(lst, item)) { Py_XDECREF(item); Py_DECREF(lst); return NULL; }
    Py_DECREF(item);
  }
  PyObject *out = Py_BuildValue("((LLL)N)", L->grid[0], L->grid[1], L->grid[2], lst);
  return out;
}

static PyObject *py_derive(PyObject *self, PyObject *args) {
  const char *op;
  PyObject *inputs, *outputs;
  long long cfg;
  if (!g_ready) {
    PyErr_SetString(PyExc_RuntimeError, "areal_tik_plugin.runtime.native: setup() has not run");
    return NULL;
  }
  if (!PyArg_ParseTuple(args, "sOOL", &op, &inputs, &outputs, &cfg)) return NULL;
  launch_t L;
  int k = derive_any(op, inputs, outputs, cfg, &L);
  if (k < 0) return NULL;
  if (k == 0) Py_RETURN_NONE;
  return launch_to_py(&L);
}

/* learn(op, inputs, outputs, cfg, grid, params, kernel_info[, refuse]) -> (ok: bool, reason: str)
 * refuse: register the kind as refused with this reason (the Python side found the record unusable).
 * params: the recorded launch's kernel parameters, [(type_str, value)] in signature order (constexprs
 * left out; tensors as data_ptr ints). kernel_info: (function, num_warps, num_ctas, shared, launch_pdl,
 * cooperative, global_scratch_size, profile_scratch_size, spec_ok, device_obj). */
static PyObject *py_learn(PyObject *self, PyObject *args) {
  const char *op;
  PyObject *inputs, *outputs, *grid, *params, *info;
  const char *refuse = NULL;
  long long cfg;
  if (!g_ready) {
    PyErr_SetString(PyExc_RuntimeError, "areal_tik_plugin.runtime.native: setup() has not run");
    return NULL;
  }
  if (!PyArg_ParseTuple(args, "sOOLOOO|z", &op, &inputs, &outputs, &cfg, &grid, &params, &info, &refuse)) return NULL;
  launch_t L;
  int k = derive_any(op, inputs, outputs, cfg, &L);
  if (k < 0) return NULL;
  if (k == 0) return Py_BuildValue("(Os)", Py_False, "inputs not handled by the native path");
  unsigned long long fn;
  int nw, nc, sh, pdl, coop, spec_ok;
  long long gs, ps;
  PyObject *devobj;
  if (!PyArg_ParseTuple(info, "KiiiiiLLpO", &fn, &nw, &nc, &sh, &pdl, &coop, &gs, &ps, &spec_ok, &devobj)) return NULL;
  char reason[96] = "";
  long long gr[3] = {1, 1, 1};
  if (refuse && refuse[0]) {
    snprintf(reason, sizeof reason, "%s", refuse);
  } else if (!PyTuple_Check(grid) || PyTuple_GET_SIZE(grid) < 1 || PyTuple_GET_SIZE(grid) > 3) {
    snprintf(reason, sizeof reason, "recorded grid is not a tuple of 1-3 ints");
  } else {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(grid); i++) gr[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(grid, i));
    if (PyErr_Occurred()) return NULL;
    if (gr[0] != L.grid[0] || gr[1] != L.grid[1] || gr[2] != L.grid[2])
      snprintf(reason, sizeof reason, "grid (%lld,%lld,%lld) != derived (%lld,%lld,%lld)", gr[0], gr[1], gr[2],
               L.grid[0], L.grid[1], L.grid[2]);
  }
  if (!reason[0] && (!spec_ok)) snprintf(reason, sizeof reason, "kernel specialization flags differ");
  if (!reason[0] && (gs || ps)) snprintf(reason, sizeof reason, "kernel needs scratch memory");
  if (!reason[0] && (nc != 1)) snprintf(reason, sizeof reason, "kernel uses clusters");
  if (!reason[0]) {
    if (!PyList_Check(params)) {
      PyErr_SetString(PyExc_TypeError, "learn: params must be a list");
      return NULL;
    }
    Py_ssize_t np = PyList_GET_SIZE(params), j = 0;
    for (int i = 0; i < L.n && !reason[0]; i++) {
      const arg_t *a = &L.a[i];
      if (is_constexpr(a)) continue;
      if (j >= np) { snprintf(reason, sizeof reason, "fewer recorded parameters than derived"); break; }
      PyObject *it = PyList_GET_ITEM(params, j++);
      const char *ty;
      PyObject *val;
      if (!PyArg_ParseTuple(it, "sO", &ty, &val)) return NULL;
      if (a->kind == K_PTR) {
        long long p = PyLong_AsLongLong(val);
        if (PyErr_Occurred()) return NULL;
        if (ty[0] != '*' || p != a->i) snprintf(reason, sizeof reason, "parameter %d: pointer differs", i);
      } else if (a->kind == K_F32) {
        double f = PyFloat_AsDouble(val);
        if (PyErr_Occurred()) return NULL;
        if (strcmp(ty, "fp32") || (float)f != (float)a->f) snprintf(reason, sizeof reason, "parameter %d: float differs", i);
      } else {
        long long v = PyLong_AsLongLong(val);
        if (PyErr_Occurred()) return NULL;
        const char *want = arg_class(a) >= 4 ? "i64" : "i32";
        if (strcmp(ty, want) || v != a->i)
          snprintf(reason, sizeof reason, "parameter %d: %s %lld != derived %s %lld", i, ty, v, want, a->i);
      }
    }
    if (!reason[0] && j != np) snprintf(reason, sizeof reason, "more recorded parameters than derived");
  }
  /* register (or refuse) under the derived key */
  plan_t *pl = find_plan(L.op, L.variant, L.dtype, L.wdtype, L.device, L.size, L.a, L.n);
  if (!pl) {
    for (int p = 0; p < NPLANS; p++)
      if (!g_plans[p].used) { pl = &g_plans[p]; break; }
    if (!pl) return Py_BuildValue("(Os)", Py_False, "plan table full");
  }
  Py_XDECREF(pl->devobj);
  memset(pl, 0, sizeof *pl);
  pl->used = 1;
  pl->refused = reason[0] != 0;
  pl->op = L.op; pl->variant = L.variant; pl->dtype = L.dtype; pl->wdtype = L.wdtype; pl->device = L.device;
  pl->size = L.size; pl->n = L.n;
  for (int i = 0; i < L.n; i++) pl->cls[i] = arg_class(&L.a[i]);
  pl->cfg[0] = cfg;
  pl->fn = (CUfunction)(uintptr_t)fn;
  pl->num_warps = nw; pl->num_ctas = nc; pl->shared = sh; pl->pdl = pdl; pl->coop = coop;
  Py_INCREF(devobj);
  pl->devobj = devobj;
  snprintf(pl->reason, sizeof pl->reason, "%s", reason);
  if (reason[0]) return Py_BuildValue("(Os)", Py_False, reason);
  return Py_BuildValue("(Os)", Py_True, "");
}

/* ---------------------------------------------------------------- generic launch
 * glaunch(fn, grid, args, kw): any launch of an @triton.jit kernel through the kernel modules' launch helper
 * (``_rowops._launch``), served from a *variant* learned off Triton's own launch of a call of the same class:
 * the same kernel object, the same keyword arguments (constexprs and compile options, compared by value),
 * the same current device and the same class of every positional argument. The class refines Triton 3.6's
 * specialization key (tensor: dtype and 16-byte alignment; int: ==1, divisible by 16 or neither, and 32 or 64
 * bit; bool: its value; None; float; TensorDescriptor: dtype, block shape, padding, base alignment and the
 * 16-divisibility of every shape and stride), so a variant is the compiled kernel Triton's run() would pick.
 * The variant's parameter kinds are read off that compiled kernel's signature (runtime/native/launch.py);
 * the first call of every class goes through Triton and is then derived here and compared, parameter by
 * parameter and byte by byte for the TMA descriptors, with what Triton passed (the variant is refused on any
 * difference). Host TMA descriptors are encoded with cuTensorMapEncodeTiled exactly as Triton's
 * fill_tma_descriptor does. */

#define GA_MAX 64 /* positional arguments */
#define GD_MAX 6  /* tensor descriptors per launch */
#define GK_MAX 32 /* keyword arguments */
#define GV_SLOTS 4096

enum { GC_TENSOR = 1, GC_NONE, GC_BOOL, GC_INT, GC_FLOAT, GC_DESC };

typedef struct {
  unsigned char cls;
  long long clsx, clsy; /* exact class data */
  long long v;          /* int / bool value, pointer */
  double f;
  int rank;             /* descriptor */
  long long shape[5], stride[5];
} garg_t;

typedef struct {
  int used, refused;
  unsigned long long h;
  PyObject *fn, *kernel;
  int device, nargs, nkw;
  PyObject *kwk[GK_MAX], *kwv[GK_MAX];
  unsigned char cls[GA_MAX];
  long long clsx[GA_MAX], clsy[GA_MAX];
  unsigned char kind[GA_MAX];
  gdesc_t desc[GD_MAX];
  int ndesc;
  CUfunction func;
  int num_warps, shared, pdl, coop;
  char reason[96];
} gvar_t;

static gvar_t *g_var; /* GV_SLOTS, allocated at the first learn */
static int g_var_count;
static long long g_ghits, g_gmisses, g_gnot;
static PyObject *g_desc_type, *g_gdesc_type, *s_base, *s_block_shape, *s_strides, *s_padding, *s_layout;
/* Gluon descriptors carry their shared-memory layout, part of Triton's key: each distinct layout (compared
 * by identity, then by value) gets an index 1..GL_MAX in the descriptor's class. */
#define GL_MAX 31
static PyObject *g_layouts[GL_MAX];
static int g_nlayouts;

/* 1..GL_MAX: the layout's index; 0: the table is full (left to Triton); -1: error. */
static int layout_index(PyObject *lay) {
  for (int i = 0; i < g_nlayouts; i++)
    if (g_layouts[i] == lay) return i + 1;
  for (int i = 0; i < g_nlayouts; i++) {
    if (Py_TYPE(g_layouts[i]) != Py_TYPE(lay)) continue;
    int r = PyObject_RichCompareBool(g_layouts[i], lay, Py_EQ);
    if (r < 0) return -1;
    if (r) return i + 1;
  }
  if (g_nlayouts == GL_MAX) return 0;
  Py_INCREF(lay);
  g_layouts[g_nlayouts++] = lay;
  return g_nlayouts;
}

static int read_seq(PyObject *o, long long *out, int max) {
  PyObject *f = PySequence_Fast(o, "expected a sequence");
  if (!f) { PyErr_Clear(); return -1; }
  Py_ssize_t n = PySequence_Fast_GET_SIZE(f);
  if (n < 1 || n > max) { Py_DECREF(f); return -1; }
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *it = PySequence_Fast_GET_ITEM(f, i);
    if (!PyLong_Check(it)) { Py_DECREF(f); return -1; }
    out[i] = PyLong_AsLongLong(it);
    if (out[i] == -1 && PyErr_Occurred()) { PyErr_Clear(); Py_DECREF(f); return -1; }
  }
  Py_DECREF(f);
  return (int)n;
}

/* The class of one positional argument. 1: read; 0: a kind of argument this path leaves to Triton; -1: error. */
static int gread(PyObject *o, garg_t *a) {
  memset(a, 0, sizeof *a);
  PyTypeObject *tp = Py_TYPE(o);
  if ((PyObject *)tp == g_tensor_type || (PyObject *)tp == g_param_type) {
    PyObject *dt = PyObject_GetAttr(o, s_dtype);
    if (!dt) return -1;
    Py_DECREF(dt); /* torch dtypes are immortal singletons: the address names the dtype */
    PyObject *p = PyObject_CallMethodNoArgs(o, s_data_ptr);
    if (!p) return -1;
    a->v = PyLong_AsLongLong(p);
    Py_DECREF(p);
    if (a->v == -1 && PyErr_Occurred()) return -1;
    a->cls = GC_TENSOR;
    a->clsx = (long long)(uintptr_t)dt;
    a->clsy = (a->v % 16) == 0;
    return 1;
  }
  if (o == Py_None) { a->cls = GC_NONE; return 1; }
  if (PyBool_Check(o)) { a->cls = GC_BOOL; a->v = a->clsx = (o == Py_True); return 1; }
  if (PyLong_CheckExact(o)) {
    int ovf = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &ovf);
    if (ovf) return 0; /* u64 / big ints: Triton's own path */
    if (v == -1 && PyErr_Occurred()) return -1;
    a->cls = GC_INT;
    a->v = v;
    a->clsx = (v == 1 ? 1 : (v % 16 == 0 ? 2 : 3)) | ((v >= -2147483648LL && v <= 2147483647LL) ? 0 : 4);
    return 1;
  }
  if (PyFloat_CheckExact(o)) { a->cls = GC_FLOAT; a->f = PyFloat_AS_DOUBLE(o); return 1; }
  int gluon = g_gdesc_type && (PyObject *)tp == g_gdesc_type;
  if ((g_desc_type && (PyObject *)tp == g_desc_type) || gluon) {
    long long li = 0;
    if (gluon) {
      PyObject *lay = PyObject_GetAttr(o, s_layout);
      if (!lay) return -1;
      int r = layout_index(lay);
      Py_DECREF(lay);
      if (r <= 0) return r;
      li = r;
    }
    PyObject *base = PyObject_GetAttr(o, s_base);
    if (!base) return -1;
    garg_t b;
    int k = gread(base, &b);
    Py_DECREF(base);
    if (k <= 0) return k;
    if (b.cls != GC_TENSOR) return 0;
    PyObject *sh = PyObject_GetAttr(o, s_shape), *st = PyObject_GetAttr(o, s_strides),
             *bl = PyObject_GetAttr(o, s_block_shape), *pd = PyObject_GetAttr(o, s_padding);
    int ok = sh && st && bl && pd;
    long long blk[5];
    int r1 = -1, r2 = -1, r3 = -1, nan = 0;
    if (ok) {
      r1 = read_seq(sh, a->shape, 5);
      r2 = read_seq(st, a->stride, 5);
      r3 = read_seq(bl, blk, 5);
      nan = PyUnicode_Check(pd) && PyUnicode_CompareWithASCIIString(pd, "nan") == 0;
      if (PyUnicode_Check(pd) && !nan && PyUnicode_CompareWithASCIIString(pd, "zero") != 0) r1 = -1;
    }
    Py_XDECREF(sh); Py_XDECREF(st); Py_XDECREF(bl); Py_XDECREF(pd);
    if (!ok) return -1;
    if (r1 < 1 || r2 != r1 || r3 != r1) return 0;
    a->cls = GC_DESC;
    a->v = b.v;
    a->rank = r1;
    long long x = b.clsy | ((long long)nan << 1) | ((long long)r1 << 2);
    for (int i = 0; i < r1; i++) {
      if (blk[i] < 1 || blk[i] > 256) return 0;
      x |= (blk[i] - 1) << (5 + 8 * i); /* 8 bits per block dim, 5 dims: bits 5..44 */
    }
    x |= li << 45; /* a Gluon descriptor's layout index (0: a host TensorDescriptor): bits 45..49 */
    long long y = 0;
    for (int i = 0; i < r1; i++) y |= ((long long)(a->shape[i] % 16 == 0) << i) | ((long long)(a->stride[i] % 16 == 0) << (8 + i));
    a->clsx = x;
    a->clsy = y ^ ((long long)(uintptr_t)b.clsx << 16); /* the base's dtype (an address) above the divisibility bits */
    return 1;
  }
  return 0;
}

static unsigned long long mix(unsigned long long h, unsigned long long v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}

typedef struct {
  int nargs, nkw, device;
  garg_t a[GA_MAX];
  PyObject *kwk[GK_MAX], *kwv[GK_MAX];
  long long grid[3];
  unsigned long long h;
} gcall_t;

/* 1: read; 0: left to Triton; -1: error */
static int gcall_read(PyObject *fn, PyObject *grid, PyObject *args, PyObject *kw, gcall_t *c) {
  if (!PyTuple_Check(args) || (kw != Py_None && !PyDict_Check(kw))) return 0;
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  if (n > GA_MAX) return 0;
  c->nargs = (int)n;
  if (!PyTuple_Check(grid) && !PyList_Check(grid)) return 0;
  Py_ssize_t gn = PySequence_Size(grid);
  if (gn < 1 || gn > 3) return 0;
  for (int i = 0; i < 3; i++) {
    c->grid[i] = 1;
    if (i < gn) {
      PyObject *g = PyTuple_Check(grid) ? PyTuple_GET_ITEM(grid, i) : PyList_GET_ITEM(grid, i);
      if (!PyLong_Check(g)) return 0;
      c->grid[i] = PyLong_AsLongLong(g);
      if (c->grid[i] == -1 && PyErr_Occurred()) return -1;
      if (c->grid[i] < 0 || c->grid[i] > 2147483647LL) return 0;
    }
  }
  unsigned long long h = mix(1469598103934665603ULL, (unsigned long long)(uintptr_t)fn);
  for (int i = 0; i < c->nargs; i++) {
    int k = gread(PyTuple_GET_ITEM(args, i), &c->a[i]);
    if (k <= 0) return k;
    h = mix(mix(mix(h, c->a[i].cls), (unsigned long long)c->a[i].clsx), (unsigned long long)c->a[i].clsy);
  }
  c->nkw = 0;
  if (kw != Py_None) {
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(kw, &pos, &k, &v)) {
      if (c->nkw == GK_MAX) return 0;
      Py_hash_t hv = PyObject_Hash(v);
      if (hv == -1) { PyErr_Clear(); return 0; }
      Py_hash_t hk = PyObject_Hash(k);
      if (hk == -1) { PyErr_Clear(); return 0; }
      c->kwk[c->nkw] = k;
      c->kwv[c->nkw] = v;
      c->nkw++;
      h = mix(mix(h, (unsigned long long)hk), (unsigned long long)hv);
    }
  }
  c->device = g_cur_device ? cur_device() : -1; /* -1: setup_cpu (tests) */
  if (c->device == -2) return -1;
  c->h = mix(mix(h, (unsigned long long)(c->device + 7)), (unsigned long long)c->nargs);
  return 1;
}

static int same_obj(PyObject *a, PyObject *b) {
  if (a == b) return 1;
  if (Py_TYPE(a) != Py_TYPE(b)) return 0;
  int r = PyObject_RichCompareBool(a, b, Py_EQ);
  if (r < 0) { PyErr_Clear(); return 0; }
  return r;
}

static int gvar_matches(const gvar_t *v, PyObject *fn, const gcall_t *c) {
  if (v->h != c->h || v->fn != fn || v->device != c->device || v->nargs != c->nargs || v->nkw != c->nkw) return 0;
  for (int i = 0; i < c->nargs; i++)
    if (v->cls[i] != c->a[i].cls || v->clsx[i] != c->a[i].clsx || v->clsy[i] != c->a[i].clsy) return 0;
  for (int i = 0; i < c->nkw; i++)
    if (!same_obj(v->kwk[i], c->kwk[i]) || !same_obj(v->kwv[i], c->kwv[i])) return 0;
  return 1;
}

static gvar_t *gvar_find(PyObject *fn, const gcall_t *c, int create) {
  if (!g_var) {
    if (!create) return NULL;
    g_var = (gvar_t *)calloc(GV_SLOTS, sizeof(gvar_t));
    if (!g_var) { PyErr_NoMemory(); return NULL; }
  }
  for (int probe = 0; probe < GV_SLOTS; probe++) {
    gvar_t *v = &g_var[(c->h + (unsigned long long)probe) % GV_SLOTS];
    if (!v->used) {
      if (!create || g_var_count * 4 >= GV_SLOTS * 3) return NULL;
      return v;
    }
    if (gvar_matches(v, fn, c)) return v;
  }
  return NULL;
}

static void gvar_clear(void) {
  if (!g_var) return;
  for (int i = 0; i < GV_SLOTS; i++) {
    gvar_t *v = &g_var[i];
    if (!v->used) continue;
    Py_CLEAR(v->fn);
    Py_CLEAR(v->kernel);
    for (int k = 0; k < v->nkw; k++) { Py_CLEAR(v->kwk[k]); Py_CLEAR(v->kwv[k]); }
    v->used = 0;
  }
  g_var_count = 0;
}

/* The parameters the variant passes for this call: pv / params filled, maps encoded when ``encode``.
 * Returns the parameter count, or -1 with an error set. */
static int gparams(const gvar_t *v, const gcall_t *c, unsigned long long *pv, void **params, CUtensorMap *maps,
                   int encode, int *kinds) {
  int np = 0, nd = 0;
  for (int i = 0; i < c->nargs; i++) {
    const garg_t *a = &c->a[i];
    switch (v->kind[i]) {
      case GP_DROP: break;
      case GP_PTR: pv[np] = (unsigned long long)a->v; kinds[np] = GP_PTR; params[np] = &pv[np]; np++; break;
      case GP_I32: { int32_t q = (int32_t)a->v; pv[np] = 0; memcpy(&pv[np], &q, 4); kinds[np] = GP_I32; params[np] = &pv[np]; np++; break; }
      case GP_I64: pv[np] = (unsigned long long)a->v; kinds[np] = GP_I64; params[np] = &pv[np]; np++; break;
      case GP_F32: { float f = (float)a->f; pv[np] = 0; memcpy(&pv[np], &f, 4); kinds[np] = GP_F32; params[np] = &pv[np]; np++; break; }
      case GP_I8: { int8_t q = (int8_t)a->v; pv[np] = 0; memcpy(&pv[np], &q, 1); kinds[np] = GP_I8; params[np] = &pv[np]; np++; break; }
      case GP_DESC: {
        const gdesc_t *d = &v->desc[nd];
        if (a->rank != d->rank) { PyErr_SetString(PyExc_RuntimeError, "glaunch: descriptor rank changed"); return -1; }
        memset(&maps[nd], 0, sizeof maps[nd]);
        if (encode && !encode_map(&maps[nd], d, (unsigned long long)a->v, a->shape, a->stride)) return -1;
        kinds[np] = GP_DESC; pv[np] = (unsigned long long)nd; params[np] = &maps[nd]; np++;
        for (int j = 0; j < d->rank; j++) { int32_t q = (int32_t)a->shape[j]; pv[np] = 0; memcpy(&pv[np], &q, 4); kinds[np] = GP_I32; params[np] = &pv[np]; np++; }
        for (int j = 0; j < d->rank; j++) { pv[np] = (unsigned long long)a->stride[j]; kinds[np] = GP_I64; params[np] = &pv[np]; np++; }
        nd++;
        break;
      }
      default: PyErr_SetString(PyExc_RuntimeError, "glaunch: bad parameter kind"); return -1;
    }
  }
  return np;
}

#define GP_MAX (GA_MAX + GD_MAX * 10 + 2)

/* glaunch(fn, grid, args, kw|None) -> the compiled kernel (launched), False (no variant for this class yet:
 * the caller takes Triton's path and learns), None (left to Triton: an argument kind or a refused variant). */
static PyObject *py_glaunch(PyObject *self, PyObject *const *argv, Py_ssize_t nargs) {
  if (!g_fast_ready || nargs != 4) { g_gnot++; Py_RETURN_NONE; }
  gcall_t c;
  int k = gcall_read(argv[0], argv[1], argv[2], argv[3], &c);
  if (k < 0) return NULL;
  if (k == 0) { g_gnot++; Py_RETURN_NONE; }
  gvar_t *v = gvar_find(argv[0], &c, 0);
  if (!v || !v->used) { g_gmisses++; Py_RETURN_FALSE; }
  if (v->refused) { g_gnot++; Py_RETURN_NONE; }
  if (!ensure_driver()) return NULL;
  unsigned long long pv[GP_MAX];
  void *params[GP_MAX + 2];
  int kinds[GP_MAX];
  CUtensorMap maps[GD_MAX];
  int np = gparams(v, &c, pv, params, maps, 1, kinds);
  if (np < 0) return NULL;
  unsigned long long z0 = 0, z1 = 0;
  params[np] = &z0; /* global_scratch (variants require size 0) */
  params[np + 1] = &z1; /* profile_scratch (size 0) */
  if (c.grid[0] * c.grid[1] * c.grid[2] != 0) {
    unsigned long long stream;
    if (!cur_stream(c.device, &stream)) return NULL;
    if (!cu_launch(v->func, (unsigned)c.grid[0], (unsigned)c.grid[1], (unsigned)c.grid[2], v->num_warps, v->shared,
                   v->pdl, v->coop, (CUstream)(uintptr_t)stream, params))
      return NULL;
  }
  g_ghits++;
  return Py_NewRef(v->kernel);
}

/* glearn(fn, grid, args, kw|None, plan|None, reason|None) -> bool
 * plan: (kinds: list[int] per positional argument, descs: list[(swizzle, elem_size, host elem type, padding,
 * block tuple)], func, num_warps, shared, pdl, coop, kernel). None with a reason: the class is refused (its calls
 * stay on Triton's path). */
static PyObject *py_glearn(PyObject *self, PyObject *args) {
  PyObject *fn, *grid, *cargs, *kw, *plan;
  const char *reason = NULL;
  if (!g_ready) {
    PyErr_SetString(PyExc_RuntimeError, "areal_tik_plugin.runtime.native: setup() has not run");
    return NULL;
  }
  if (!PyArg_ParseTuple(args, "OOOOO|z", &fn, &grid, &cargs, &kw, &plan, &reason)) return NULL;
  gcall_t c;
  int k = gcall_read(fn, grid, cargs, kw, &c);
  if (k < 0) return NULL;
  if (k == 0) Py_RETURN_FALSE;
  gvar_t *v = gvar_find(fn, &c, 1);
  if (!v) {
    if (PyErr_Occurred()) return NULL;
    gvar_clear();
    v = gvar_find(fn, &c, 1);
    if (!v) { if (PyErr_Occurred()) return NULL; Py_RETURN_FALSE; }
  }
  if (v->used) { /* re-learned: drop the old one */
    Py_CLEAR(v->fn); Py_CLEAR(v->kernel);
    for (int i = 0; i < v->nkw; i++) { Py_CLEAR(v->kwk[i]); Py_CLEAR(v->kwv[i]); }
    g_var_count--;
  }
  memset(v, 0, sizeof *v);
  PyObject *kinds = NULL, *descs = NULL, *kernel = NULL;
  unsigned long long func = 0;
  int nw = 0, shm = 0, pdl = 0, coop = 0;
  if (plan != Py_None) {
    if (!PyArg_ParseTuple(plan, "OOKiippO", &kinds, &descs, &func, &nw, &shm, &pdl, &coop, &kernel)) return NULL;
    if (!PyList_Check(kinds) || PyList_GET_SIZE(kinds) != c.nargs || !PyList_Check(descs) ||
        PyList_GET_SIZE(descs) > GD_MAX) {
      PyErr_SetString(PyExc_ValueError, "glearn: kinds must list one kind per positional argument, descs <= 6");
      return NULL;
    }
    int nd = 0;
    for (int i = 0; i < c.nargs; i++) {
      long kd = PyLong_AsLong(PyList_GET_ITEM(kinds, i));
      if (kd < GP_DROP || kd > GP_DESC) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "glearn: unknown parameter kind");
        return NULL;
      }
      int cl = c.a[i].cls;
      int ok = kd == GP_DROP || (kd == GP_PTR && cl == GC_TENSOR) || ((kd == GP_I32 || kd == GP_I64) && cl == GC_INT) ||
               (kd == GP_F32 && cl == GC_FLOAT) || (kd == GP_I8 && (cl == GC_BOOL || cl == GC_INT)) ||
               (kd == GP_DESC && cl == GC_DESC);
      if (!ok) {
        PyErr_Format(PyExc_ValueError, "glearn: argument %d: kind %ld does not fit its class %d", i, kd, cl);
        return NULL;
      }
      if (kd == GP_DESC) {
        if (nd >= PyList_GET_SIZE(descs)) { PyErr_SetString(PyExc_ValueError, "glearn: fewer descs than descriptor arguments"); return NULL; }
        gdesc_t *d = &v->desc[nd];
        PyObject *blk;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(descs, nd), "iiiiO", &d->swizzle, &d->elem_size, &d->elem_type, &d->padding, &blk))
          return NULL;
        long long b[5];
        int r = read_seq(blk, b, 5);
        if (r != c.a[i].rank) { PyErr_SetString(PyExc_ValueError, "glearn: descriptor block rank differs from the argument's"); return NULL; }
        d->rank = r;
        for (int j = 0; j < r; j++) d->block[j] = (unsigned)b[j];
        nd++;
      }
      v->kind[i] = (unsigned char)kd;
    }
    if (nd != PyList_GET_SIZE(descs)) { PyErr_SetString(PyExc_ValueError, "glearn: more descs than descriptor arguments"); return NULL; }
    v->ndesc = nd;
  }
  v->used = 1;
  g_var_count++;
  v->h = c.h;
  v->fn = Py_NewRef(fn);
  v->device = c.device;
  v->nargs = c.nargs;
  v->nkw = c.nkw;
  for (int i = 0; i < c.nkw; i++) { v->kwk[i] = Py_NewRef(c.kwk[i]); v->kwv[i] = Py_NewRef(c.kwv[i]); }
  for (int i = 0; i < c.nargs; i++) { v->cls[i] = c.a[i].cls; v->clsx[i] = c.a[i].clsx; v->clsy[i] = c.a[i].clsy; }
  if (plan == Py_None) {
    v->refused = 1;
    snprintf(v->reason, sizeof v->reason, "%s", reason ? reason : "refused");
    Py_RETURN_FALSE;
  }
  v->func = (CUfunction)(uintptr_t)func;
  v->num_warps = nw;
  v->shared = shm;
  v->pdl = pdl;
  v->coop = coop;
  v->kernel = Py_NewRef(kernel);
  Py_RETURN_TRUE;
}

/* gderive(fn, grid, args, kw|None, encode) -> None (no variant) or [(kind, value)]: what glaunch would pass
 * (descriptor: (GP_DESC, 128 bytes) when encode, else (GP_DESC, None); floats as their fp32 bit pattern). */
static PyObject *py_gderive(PyObject *self, PyObject *args) {
  PyObject *fn, *grid, *cargs, *kw;
  int encode = 1;
  if (!g_ready) {
    PyErr_SetString(PyExc_RuntimeError, "areal_tik_plugin.runtime.native: setup() has not run");
    return NULL;
  }
  if (!PyArg_ParseTuple(args, "OOOO|p", &fn, &grid, &cargs, &kw, &encode)) return NULL;
  gcall_t c;
  int k = gcall_read(fn, grid, cargs, kw, &c);
  if (k < 0) return NULL;
  if (k == 0) Py_RETURN_NONE;
  gvar_t *v = gvar_find(fn, &c, 0);
  if (!v || !v->used || v->refused) Py_RETURN_NONE;
  unsigned long long pv[GP_MAX];
  void *params[GP_MAX + 2];
  int kinds[GP_MAX];
  CUtensorMap maps[GD_MAX];
  int np = gparams(v, &c, pv, params, maps, encode, kinds);
  if (np < 0) return NULL;
  return derived_list(np, kinds, pv, maps, encode);
}

/* tmap_bytes(PyCUtensorMap) -> the 128 bytes Triton's fill_tma_descriptor encoded (its object layout:
 * PyObject_HEAD, then the map aligned to 128). */
typedef struct {
  PyObject_HEAD;
  _Alignas(128) CUtensorMap tensorMap;
} tik_tmap_obj_t;

static PyObject *py_tmap_bytes(PyObject *self, PyObject *o) {
  if (strcmp(Py_TYPE(o)->tp_name, "triton.backends.nvidia.PyCUtensorMap") != 0 ||
      Py_TYPE(o)->tp_basicsize != (Py_ssize_t)sizeof(tik_tmap_obj_t)) {
    PyErr_Format(PyExc_TypeError, "tmap_bytes: expected Triton's PyCUtensorMap, got %s", Py_TYPE(o)->tp_name);
    return NULL;
  }
  return PyBytes_FromStringAndSize((const char *)&((tik_tmap_obj_t *)o)->tensorMap, sizeof(CUtensorMap));
}

/* gsetup(TensorDescriptor class) or gsetup((TensorDescriptor class, Gluon TensorDescriptor class or None)) */
static PyObject *py_gsetup(PyObject *self, PyObject *desc_type) {
  PyObject *host = desc_type, *gluon = Py_None;
  if (PyTuple_Check(desc_type)) {
    if (PyTuple_GET_SIZE(desc_type) != 2) {
      PyErr_SetString(PyExc_TypeError, "gsetup: expected a class or a (host class, Gluon class or None) pair");
      return NULL;
    }
    host = PyTuple_GET_ITEM(desc_type, 0);
    gluon = PyTuple_GET_ITEM(desc_type, 1);
  }
  Py_INCREF(host);
  Py_XSETREF(g_desc_type, host);
  if (gluon == Py_None) {
    Py_CLEAR(g_gdesc_type);
  } else {
    Py_INCREF(gluon);
    Py_XSETREF(g_gdesc_type, gluon);
  }
  Py_RETURN_NONE;
}

static PyObject *gstats(void) {
  int n = 0, refused = 0;
  PyObject *reasons = PyDict_New();
  if (!reasons) return NULL;
  if (g_var)
    for (int i = 0; i < GV_SLOTS; i++) {
      gvar_t *v = &g_var[i];
      if (!v->used) continue;
      n++;
      if (v->refused) {
        refused++;
        PyObject *key = PyUnicode_FromString(v->reason);
        if (!key) { Py_DECREF(reasons); return NULL; }
        PyObject *cur = PyDict_GetItemWithError(reasons, key);
        PyObject *nv = PyLong_FromLong(cur ? PyLong_AsLong(cur) + 1 : 1);
        if (!nv || PyDict_SetItem(reasons, key, nv)) { Py_XDECREF(nv); Py_DECREF(key); Py_DECREF(reasons); return NULL; }
        Py_DECREF(nv);
        Py_DECREF(key);
      }
    }
  return Py_BuildValue("{s:L,s:L,s:L,s:i,s:i,s:N}", "hits", g_ghits, "misses", g_gmisses, "not_handled", g_gnot,
                       "variants", n, "refused", refused, "refused_reasons", reasons);
}

static PyObject *py_invalidate(PyObject *self, PyObject *noargs) {
  for (int p = 0; p < NPLANS; p++) {
    Py_CLEAR(g_plans[p].devobj);
    g_plans[p].used = 0;
  }
  lin_clear();
  gvar_clear();
  Py_RETURN_NONE;
}

static PyObject *py_stats(PyObject *self, PyObject *noargs) {
  PyObject *plans = PyList_New(0);
  if (!plans) return NULL;
  for (int p = 0; p < NPLANS; p++) {
    plan_t *pl = &g_plans[p];
    if (!pl->used) continue;
    PyObject *d = Py_BuildValue("{s:s,s:i,s:i,s:L,s:O,s:s,s:i,s:i}", "op", pl->op == OP_RMSNORM ? "rmsnorm" : "swiglu",
                                "variant", pl->variant, "dtype", pl->dtype, "size", pl->size, "refused",
                                pl->refused ? Py_True : Py_False, "reason", pl->reason, "num_warps", pl->num_warps,
                                "pdl", pl->pdl);
    if (!d || PyList_Append(plans, d)) { Py_XDECREF(d); Py_DECREF(plans); return NULL; }
    Py_DECREF(d);
  }
  PyObject *gen = gstats();
  if (!gen) { Py_DECREF(plans); return NULL; }
  return Py_BuildValue("{s:L,s:L,s:L,s:N,s:N,s:N}", "hits", g_hits, "misses", g_misses, "not_handled", g_unsupported,
                       "plans", plans, "linear", lin_stats(), "launch", gen);
}

/* setup(torch) : caches the objects the hot path uses. */
static PyObject *py_setup(PyObject *self, PyObject *torch) {
  const char *names[3] = {"bfloat16", "float16", "float32"};
  for (int i = 0; i < 3; i++) {
    Py_XSETREF(g_dtypes[i], PyObject_GetAttrString(torch, names[i]));
    if (!g_dtypes[i]) return NULL;
  }
  PyObject *C = PyObject_GetAttrString(torch, "_C");
  PyObject *nn = PyObject_GetAttrString(torch, "nn");
  if (!C || !nn) { Py_XDECREF(C); Py_XDECREF(nn); return NULL; }
  PyObject *param = PyObject_GetAttrString(nn, "Parameter");
  Py_DECREF(nn);
  Py_XSETREF(g_param_type, param);
  Py_XSETREF(g_tensor_type, PyObject_GetAttrString(torch, "Tensor"));
  Py_XSETREF(g_empty, PyObject_GetAttrString(torch, "empty"));
  Py_XSETREF(g_grad_enabled, PyObject_GetAttrString(C, "is_grad_enabled"));
  Py_XSETREF(g_raw_stream, PyObject_GetAttrString(C, "_cuda_getCurrentRawStream"));
  Py_XSETREF(g_cur_device, PyObject_GetAttrString(C, "_cuda_getDevice"));
  Py_DECREF(C);
  if (!g_param_type || !g_tensor_type || !g_empty || !g_grad_enabled || !g_raw_stream || !g_cur_device) {
    /* a CPU build of torch has no _cuda_* functions: the path stays off (setup raises) */
    return NULL;
  }
  g_ready = g_fast_ready = 1;
  g_cpu_ok = 0;
  Py_RETURN_NONE;
}

/* setup_cpu(torch): derive() and learn() only, CPU tensors accepted (tests on a machine without a GPU). */
static PyObject *py_setup_cpu(PyObject *self, PyObject *torch) {
  const char *names[3] = {"bfloat16", "float16", "float32"};
  for (int i = 0; i < 3; i++) {
    Py_XSETREF(g_dtypes[i], PyObject_GetAttrString(torch, names[i]));
    if (!g_dtypes[i]) return NULL;
  }
  PyObject *nn = PyObject_GetAttrString(torch, "nn");
  if (!nn) return NULL;
  Py_XSETREF(g_param_type, PyObject_GetAttrString(nn, "Parameter"));
  Py_DECREF(nn);
  Py_XSETREF(g_tensor_type, PyObject_GetAttrString(torch, "Tensor"));
  if (!g_param_type || !g_tensor_type) return NULL;
  g_ready = g_cpu_ok = 1;
  g_fast_ready = 0;
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"rmsnorm", (PyCFunction)(void (*)(void))py_rmsnorm, METH_FASTCALL, "rmsnorm(x, weight, eps, residual|None)"},
    {"swiglu", (PyCFunction)(void (*)(void))py_swiglu, METH_FASTCALL, "swiglu(gate, up)"},
    {"swiglu_fused", (PyCFunction)(void (*)(void))py_swiglu_fused, METH_FASTCALL, "swiglu_fused(gate_up)"},
    {"linear", (PyCFunction)(void (*)(void))py_linear, METH_FASTCALL, "linear(x [M, K], weight [N, K], bias|None)"},
    {"learn_linear", py_learn_linear, METH_VARARGS, "learn_linear(x, weight, bias, recipe|None[, reason])"},
    {"linear_derive", py_linear_derive, METH_VARARGS, "linear_derive(x, weight, bias, y, temps[, encode]) -> [(kind, value)] | None"},
    {"derive", py_derive, METH_VARARGS, "derive(op, inputs, outputs, cfg) -> (grid, params) | None"},
    {"learn", py_learn, METH_VARARGS, "learn(op, inputs, outputs, cfg, grid, params, info) -> (ok, reason)"},
    {"glaunch", (PyCFunction)(void (*)(void))py_glaunch, METH_FASTCALL, "glaunch(fn, grid, args, kw|None)"},
    {"glearn", py_glearn, METH_VARARGS, "glearn(fn, grid, args, kw|None, plan|None[, reason])"},
    {"gderive", py_gderive, METH_VARARGS, "gderive(fn, grid, args, kw|None[, encode]) -> [(kind, value)] | None"},
    {"tmap_bytes", py_tmap_bytes, METH_O, "tmap_bytes(PyCUtensorMap) -> bytes"},
    {"gsetup", py_gsetup, METH_O, "gsetup(TensorDescriptor class)"},
    {"invalidate", py_invalidate, METH_NOARGS, "drop every plan"},
    {"stats", py_stats, METH_NOARGS, "hit / miss counters and plans"},
    {"setup", py_setup, METH_O, "setup(torch)"},
    {"setup_cpu", py_setup_cpu, METH_O, "setup_cpu(torch): derive/learn only"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_tik_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__tik_native(void) {
  s_dtype = PyUnicode_InternFromString("dtype");
  s_shape = PyUnicode_InternFromString("shape");
  s_stride = PyUnicode_InternFromString("stride");
  s_data_ptr = PyUnicode_InternFromString("data_ptr");
  s_get_device = PyUnicode_InternFromString("get_device");
  s_requires_grad = PyUnicode_InternFromString("requires_grad");
  s_base = PyUnicode_InternFromString("base");
  s_layout = PyUnicode_InternFromString("layout");
  s_block_shape = PyUnicode_InternFromString("block_shape");
  s_strides = PyUnicode_InternFromString("strides");
  s_padding = PyUnicode_InternFromString("padding");
  s_kwnames = Py_BuildValue("(ss)", "dtype", "device");
  if (!s_kwnames) return NULL;
  return PyModule_Create(&moddef);
}
