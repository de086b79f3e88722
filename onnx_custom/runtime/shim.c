/* onnx-custom kernel host: a CPython extension that is also an ONNX Runtime custom-op library.
 *
 * Python imports this file's shared object as a module, describes kernels with make_op(), queues
 * them with set_pending(), then asks ORT to load the very same file
 * (SessionOptions.register_custom_ops_library). ORT calls RegisterCustomOps(), which adds the
 * queued ops. Every kernel invocation crosses into Python exactly once.
 *
 * ORT's headers are not available here: ORT's C ABI (struct layouts, 0-based OrtApi slot indices,
 * one typed function pointer per slot) comes from the project's one shared declaration,
 * onnx_custom_ort_abi.h (onnx_custom/runtime/include, put on the include path by shim_build.py), also
 * used by the native kernel library. Only the OrtApiBase pointer that ORT hands to
 * RegisterCustomOps is used, never another ORT copy.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL onnx_custom_shim_ARRAY_API
#include <numpy/arrayobject.h>
#include <stdint.h>
#include <string.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <pthread.h>
#include <signal.h>

#if PY_VERSION_HEX >= 0x030D0000
#define OC_FINALIZING() Py_IsFinalizing()
#define OC_CURRENT_TSTATE() PyThreadState_GetUnchecked()
#else
#define OC_FINALIZING() _Py_IsFinalizing()
#define OC_CURRENT_TSTATE() _PyThreadState_UncheckedGet()
#endif

/* ---- ORT's C ABI ------------------------------------------------------------------------- */
#include "onnx_custom_ort_abi.h"

/* output shape rules (see _abi.py): like input k, broadcast of the inputs, Python shape_fn, unknown */
enum { RULE_LIKE = 0, RULE_BROADCAST = 1, RULE_PY = 2, RULE_UNKNOWN = 3 };

/* The OrtApi version asked for first (it has every function used here), and the fallback (the
 * oldest ORT that reads our OrtCustomOp fields) that runs everything but STRINGS attributes, the
 * unknown-rank check and the by-reference shape read (see the OC_SINCE_* gates). */
#define SHIM_API_VERSION 30
#define SHIM_API_FALLBACK 17

/* ---- our objects ------------------------------------------------------------------------- */
typedef struct AttrDesc {
  char* name;
  int kind;
} AttrDesc;

/* One per (kernel spec, domain, op type); allocated once and never freed (ORT keeps pointers). */
typedef struct Op {
  OcCustomOp abi; /* must stay first: ORT passes &abi back to us */
  char* name;
  char* qualname;
  size_t n_in, n_out;
  int* in_char;
  int* out_char;
  size_t n_attrs;
  AttrDesc* attrs;
  int* in_type;         /* ONNX element type input i must have (0: any) */
  int* out_type;        /* ONNX element type ORT may assume for output i (0: any) */
  int rule;
  size_t like_index;    /* RULE_LIKE: the input whose shape every output takes */
  int out_mode;         /* kernel writes into preallocated outputs passed as out= */
  /* The Python side owns these two; it clears them (op_release) once no SessionOptions uses the
   * op, and frees the struct (op_free) once the KernelSpec is gone and no kernel is alive. */
  PyObject* bind;       /* bind(attrs, missing, input_elems, output_elems) -> (fn, kwargs, shape_fn) */
  PyObject* infer;      /* infer(inputs: list, attrs: dict) -> list[(elem, dims) or None] */
  long live_kernels;    /* kernels created and not yet destroyed (GIL-protected) */
  int dead;             /* Python dropped the op: free it when live_kernels reaches 0 */
} Op;

typedef struct Kernel {
  Op* op;
  char* node;           /* node name, for error messages */
  PyObject* fn;
  PyObject* kwargs;
  PyObject* shape_fn;
  size_t n_static;
  int64_t* static_rank; /* -1: unknown */
  int64_t** static_dims;
} Kernel;

static const void* g_api = NULL;        /* OrtApi function table from ORT's OrtApiBase (OC_API) */
static int g_api_version = 0;
static PyObject* g_descr[32];           /* ONNX element type -> numpy dtype (owned refs) */
static PyObject* g_format_error = NULL; /* format_error(qualname, node, exc) -> str */
static PyObject* g_out_key = NULL;
static volatile int g_shutdown = 0;

static OrtStatus* make_status(int code, const char* msg) {
  return OC_API(g_api, CreateStatus)(code, msg);
}

static void release_status(OrtStatus* st) {
  if (st) OC_API(g_api, ReleaseStatus)(st);
}

/* Turns the pending Python exception into an ORT status carrying the traceback text (the Python
 * side also keeps the exception under a token written into the text, to re-raise it typed). */
static OrtStatus* status_from_pyerr(const Op* op, const char* node) {
  PyObject *etype = NULL, *exc = NULL, *etb = NULL;
  PyErr_Fetch(&etype, &exc, &etb);
  PyErr_NormalizeException(&etype, &exc, &etb);
  if (exc && etb) PyException_SetTraceback(exc, etb);
  Py_XDECREF(etype);
  Py_XDECREF(etb);
  PyObject* text = NULL;
  if (g_format_error && exc) {
    text = PyObject_CallFunction(g_format_error, "ssO", op ? op->qualname : "?", node ? node : "", exc);
  }
  OrtStatus* st;
  if (text && PyUnicode_Check(text)) {
    st = make_status(OC_ORT_FAIL, PyUnicode_AsUTF8(text));
  } else {
    PyErr_Clear();
    st = make_status(OC_ORT_FAIL, "onnx-custom: Python kernel failed (error text unavailable)");
  }
  Py_XDECREF(text);
  Py_XDECREF(exc);
  PyErr_Clear();
  return st;
}

static OrtStatus* status_fmt(const Op* op, const char* fmt, ...) {
  char buf[1024];
  int off = snprintf(buf, sizeof buf, "onnx-custom kernel %s: ", op ? op->qualname : "?");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + off, sizeof buf - (size_t)off, fmt, ap);
  va_end(ap);
  return make_status(OC_ORT_FAIL, buf);
}

/* ---- OrtCustomOp callbacks ---------------------------------------------------------------- */
/* The Op whose first member ORT hands back (Op.abi stays first). */
static const Op* op_of(const OcCustomOp* abi) { return (const Op*)abi; }

static const char* op_get_name(const OcCustomOp* op) { return op_of(op)->name; }
static const char* op_get_ep(const OcCustomOp* op) { (void)op; return "CPUExecutionProvider"; }
static int op_in_type(const OcCustomOp* op, size_t i) {
  const Op* o = op_of(op);
  return i < o->n_in ? o->in_type[i] : 0;
}
static int op_out_type(const OcCustomOp* op, size_t i) {
  const Op* o = op_of(op);
  return i < o->n_out ? o->out_type[i] : 0;
}
static size_t op_in_count(const OcCustomOp* op) { return op_of(op)->n_in; }
static size_t op_out_count(const OcCustomOp* op) { return op_of(op)->n_out; }
static int op_in_char(const OcCustomOp* op, size_t i) {
  const Op* o = op_of(op);
  return i < o->n_in ? o->in_char[i] : OC_IO_REQUIRED;
}
static int op_out_char(const OcCustomOp* op, size_t i) {
  const Op* o = op_of(op);
  return i < o->n_out ? o->out_char[i] : OC_IO_REQUIRED;
}
static int op_mem_default(const OcCustomOp* op, size_t i) { (void)op; (void)i; return 0; }
static int op_one(const OcCustomOp* op) { (void)op; return 1; }
static int op_zero(const OcCustomOp* op) { (void)op; return 0; }
static int op_end_version(const OcCustomOp* op) { (void)op; return INT_MAX; }
static size_t op_no_pairs(int** a, int** b) { *a = NULL; *b = NULL; return 0; }
static void op_release_pairs(int* a, int* b) { (void)a; (void)b; }
static void* op_create_kernel_v1(const OcCustomOp* op, const void* api, const OrtKernelInfo* info) {
  (void)op; (void)api; (void)info;
  return NULL; /* never used: ORT takes CreateKernelV2 for version >= 16 */
}
static void op_compute_v1(void* k, OrtKernelContext* ctx) { (void)k; (void)ctx; }

static int interpreter_alive(void) {
  return !g_shutdown && Py_IsInitialized() && !OC_FINALIZING();
}

/* ---- Python thread states for ONNX Runtime's threads ---------------------------------------
 * ORT runs kernels on the caller's thread, on its intra-op pool (run_async) and on its inter-op
 * pool (ORT_PARALLEL). The pool threads are not Python threads: PyGILState_Ensure would create a
 * thread state and PyGILState_Release destroy it again on every call (tens of microseconds:
 * allocation, munmap of its frame stack). Instead each such thread gets one thread state, made
 * with PyThreadState_New the first time it calls a kernel (which also binds it as the thread's
 * GIL-state, so nested PyGILState_Ensure in kernels finds it), and kept for the thread's life.
 *
 * When the thread exits, a pthread key destructor hands the state to a reaper thread: the exiting
 * thread must not wait for the GIL itself, because ORT joins its pool threads while destroying a
 * session, usually from a Python thread that holds the GIL. The reaper adopts the state (it has
 * none of its own), clears and deletes it. After interpreter shutdown starts (g_shutdown, set by
 * an atexit hook) nothing touches these states any more: finalization frees them itself. */
static PyInterpreterState* g_interp = NULL;
static _Thread_local PyThreadState* t_tstate = NULL;
static pthread_key_t g_tstate_key;
static int g_tstate_key_ok = 0;

typedef struct DeadState {
  PyThreadState* ts;
  struct DeadState* next;
} DeadState;
static pthread_mutex_t g_reap_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_reap_cv = PTHREAD_COND_INITIALIZER;
static DeadState* g_dead = NULL;
static int g_reaper_running = 0, g_reaper_stop = 0;
static pthread_t g_reaper;
static long g_ts_created = 0, g_ts_deleted = 0; /* counters for tests (atomic) */

static void* reaper_main(void* arg) {
  (void)arg;
  pthread_mutex_lock(&g_reap_mu);
  for (;;) {
    while (!g_dead && !g_reaper_stop) pthread_cond_wait(&g_reap_cv, &g_reap_mu);
    DeadState* d = g_dead;
    if (!d) break; /* asked to stop and nothing left */
    g_dead = d->next;
    pthread_mutex_unlock(&g_reap_mu);
    if (interpreter_alive()) {
      PyEval_RestoreThread(d->ts); /* this thread has no state of its own: adopt the dead one */
      PyThreadState_Clear(d->ts);
      PyThreadState_DeleteCurrent(); /* also releases the GIL */
      __atomic_add_fetch(&g_ts_deleted, 1, __ATOMIC_RELAXED);
    } /* else: interpreter shutdown frees every thread state of the interpreter itself */
    free(d);
    pthread_mutex_lock(&g_reap_mu);
  }
  pthread_mutex_unlock(&g_reap_mu);
  return NULL;
}

/* With g_reap_mu held. */
static int start_reaper_locked(void) {
  if (g_reaper_running) return 0;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* the reaper inherits "all signals blocked" */
  int rc = pthread_create(&g_reaper, NULL, reaper_main, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc == 0) g_reaper_running = 1;
  return rc;
}

static void tstate_key_destructor(void* p) {
  t_tstate = NULL;
  if (!p || g_shutdown) return;
  DeadState* d = malloc(sizeof *d);
  if (!d) return; /* out of memory at thread exit: leaking one thread state is all we can do */
  d->ts = p;
  pthread_mutex_lock(&g_reap_mu);
  if (start_reaper_locked() != 0) {
    pthread_mutex_unlock(&g_reap_mu);
    free(d); /* cannot reap: leak it rather than block this thread on the GIL */
    return;
  }
  d->next = g_dead;
  g_dead = d;
  pthread_cond_signal(&g_reap_cv);
  pthread_mutex_unlock(&g_reap_mu);
}

static void after_fork_child(void) {
  /* Only the forking thread survives; Python deletes the other threads' states itself
   * (PyOS_AfterFork_Child), including any waiting for the reaper: forget them. */
  pthread_mutex_init(&g_reap_mu, NULL);
  pthread_cond_init(&g_reap_cv, NULL);
  g_dead = NULL;
  g_reaper_running = 0;
  g_reaper_stop = 0;
}

typedef struct GilHold {
  int mode; /* 0: restored our thread state, 1: PyGILState_Ensure, 2: this thread already held it */
  PyGILState_STATE gs;
} GilHold;

/* Takes the GIL on any thread; returns -1 (nothing held) only when no thread state can be made. */
static int gil_enter(GilHold* g) {
  PyThreadState* ts = t_tstate;
  if (ts) {
    if (OC_CURRENT_TSTATE() == ts) { g->mode = 2; return 0; } /* re-entered from a kernel */
    PyEval_RestoreThread(ts);
    g->mode = 0;
    return 0;
  }
  if (PyGILState_GetThisThreadState() != NULL) { /* a thread Python knows: its state lives on */
    g->gs = PyGILState_Ensure();
    g->mode = 1;
    return 0;
  }
  ts = PyThreadState_New(g_interp);
  if (!ts) return -1;
  t_tstate = ts;
  if (g_tstate_key_ok) pthread_setspecific(g_tstate_key, ts);
  __atomic_add_fetch(&g_ts_created, 1, __ATOMIC_RELAXED);
  PyEval_RestoreThread(ts);
  g->mode = 0;
  return 0;
}

static void gil_exit(GilHold* g) {
  if (g->mode == 0) PyEval_SaveThread();
  else if (g->mode == 1) PyGILState_Release(g->gs);
}

static void op_free_struct(Op* op) {
  free(op->name);
  free(op->qualname);
  free(op->in_char);
  free(op->out_char);
  free(op->in_type);
  free(op->out_type);
  for (size_t i = 0; op->attrs && i < op->n_attrs; i++) free(op->attrs[i].name);
  free(op->attrs);
  Py_XDECREF(op->bind);
  Py_XDECREF(op->infer);
  free(op);
}

static void kernel_free(Kernel* k) {
  if (!k) return;
  free(k->node);
  if (k->static_dims) {
    for (size_t i = 0; i < k->n_static; i++) free(k->static_dims[i]);
  }
  free(k->static_dims);
  free(k->static_rank);
  free(k);
}

static void op_kernel_destroy(void* kp) {
  Kernel* k = kp;
  if (!k) return;
  GilHold g;
  if (interpreter_alive() && gil_enter(&g) == 0) {
    Op* op = k->op;
    Py_XDECREF(k->fn);
    Py_XDECREF(k->kwargs);
    Py_XDECREF(k->shape_fn);
    if (--op->live_kernels == 0 && op->dead) op_free_struct(op);
    gil_exit(&g);
  } /* else: the interpreter is gone; leaking the references is the only safe choice */
  kernel_free(k);
}

/* An OrtAllocator that remembers the size of every block it hands out (see OC_ATTR_STRINGS). */
typedef struct SizedAlloc {
  OcAllocator abi; /* must stay first: ORT passes &abi back to us */
  const OrtMemoryInfo* info;
  size_t n, cap;
  void** ptrs;
  size_t* sizes;
} SizedAlloc;

static void* sized_alloc_alloc(OcAllocator* self, size_t size) {
  SizedAlloc* al = (SizedAlloc*)self;
  if (al->n == al->cap) {
    size_t cap = al->cap ? al->cap * 2 : 16;
    void** p = realloc(al->ptrs, cap * sizeof(void*));
    if (!p) return NULL;
    al->ptrs = p;
    size_t* z = realloc(al->sizes, cap * sizeof(size_t));
    if (!z) return NULL;
    al->sizes = z;
    al->cap = cap;
  }
  void* block = malloc(size ? size : 1);
  if (!block) return NULL;
  al->ptrs[al->n] = block;
  al->sizes[al->n++] = size;
  return block;
}

static void sized_alloc_free(OcAllocator* self, void* p) {
  SizedAlloc* al = (SizedAlloc*)self;
  for (size_t i = 0; p && i < al->n; i++) {
    if (al->ptrs[i] == p) { al->ptrs[i] = NULL; break; }
  }
  free(p);
}

static const OrtMemoryInfo* sized_alloc_info(const OcAllocator* self) { return ((const SizedAlloc*)self)->info; }

static int sized_alloc_init(SizedAlloc* al) {
  memset(al, 0, sizeof *al);
  OrtAllocator* def = NULL;
  OrtStatus* st = OC_API(g_api, GetAllocatorWithDefaultOptions)(&def);
  if (!st) st = OC_API(g_api, AllocatorGetInfo)(def, &al->info);
  if (st) {
    release_status(st);
    PyErr_SetString(PyExc_RuntimeError, "onnx-custom: ONNX Runtime gave no CPU allocator info");
    return -1;
  }
  al->abi.version = OC_ALLOCATOR_VERSION;
  al->abi.Alloc = sized_alloc_alloc;
  al->abi.Free = sized_alloc_free;
  al->abi.Info = sized_alloc_info;
  return 0;
}

/* Length of a string ORT wrote into one of our blocks (strlen when ORT packed it elsewhere). */
static size_t sized_alloc_length(const SizedAlloc* al, const char* s) {
  if (!s) return 0;
  for (size_t i = 0; i < al->n; i++) {
    if (al->ptrs[i] == s && al->sizes[i] > 0 && s[al->sizes[i] - 1] == '\0') return al->sizes[i] - 1;
  }
  return strlen(s);
}

static void sized_alloc_done(SizedAlloc* al) {
  for (size_t i = 0; i < al->n; i++) free(al->ptrs[i]);
  free(al->ptrs);
  free(al->sizes);
  memset(al, 0, sizeof *al);
}

static OrtStatus* tensor_view(const OrtValue* value, int* elem, int64_t* dims, size_t* rank, void** data);
static PyObject* wrap_array(int elem, const int64_t* dims, size_t rank, void* data, int writable);

/* A TENSOR attribute as a numpy array that owns a copy of the data (the OrtValue ORT fills is
 * released here). NULL with *missing set when the node lacks it. */
static PyObject* read_tensor_attr(const OrtKernelInfo* info, const char* name, int* missing) {
  OrtAllocator* alloc = NULL;
  OrtValue* value = NULL;
  OrtStatus* st = OC_API(g_api, GetAllocatorWithDefaultOptions)(&alloc);
  if (!st) st = OC_API(g_api, KernelInfoGetAttribute_tensor)(info, name, alloc, &value);
  if (st) { release_status(st); *missing = 1; return NULL; }
  int elem = 0;
  int64_t dims[32];
  size_t rank = 0;
  void* data = NULL;
  PyObject* copy = NULL;
  st = tensor_view(value, &elem, dims, &rank, &data);
  if (st) {
    PyErr_Format(PyExc_RuntimeError, "onnx-custom: cannot read TENSOR attribute '%s': %s", name,
                 OC_API(g_api, GetErrorMessage)(st));
    release_status(st);
  } else {
    PyObject* view = wrap_array(elem, dims, rank, data, 0);
    if (view) {
      copy = PyArray_NewCopy((PyArrayObject*)view, NPY_CORDER);
      Py_DECREF(view);
      /* one value per kernel instance, shared by its calls: read-only */
      if (copy) PyArray_CLEARFLAGS((PyArrayObject*)copy, NPY_ARRAY_WRITEABLE);
    }
  }
  OC_API(g_api, ReleaseValue)(value);
  return copy;
}

/* Reads one declared attribute into a Python value; *missing set when the node lacks it. */
static PyObject* read_kernel_attr(const OrtKernelInfo* info, const AttrDesc* a, int* missing) {
  OrtStatus* st = NULL;
  *missing = 0;
  switch (a->kind) {
    case OC_ATTR_INT: {
      int64_t v = 0;
      st = OC_API(g_api, KernelInfoGetAttribute_int64)(info, a->name, &v);
      if (st) { release_status(st); *missing = 1; return NULL; }
      return PyLong_FromLongLong(v);
    }
    case OC_ATTR_FLOAT: {
      float v = 0;
      st = OC_API(g_api, KernelInfoGetAttribute_float)(info, a->name, &v);
      if (st) { release_status(st); *missing = 1; return NULL; }
      return PyFloat_FromDouble((double)v);
    }
    case OC_ATTR_STRING: {
      size_t n = 0;
      st = OC_API(g_api, KernelInfoGetAttribute_string)(info, a->name, NULL, &n);
      if (st) { release_status(st); *missing = 1; return NULL; }
      char* buf = malloc(n + 1);
      if (!buf) return PyErr_NoMemory();
      st = OC_API(g_api, KernelInfoGetAttribute_string)(info, a->name, buf, &n);
      if (st) { free(buf); release_status(st); *missing = 1; return NULL; }
      /* n counts the terminating NUL ORT appends; the value itself may contain NUL bytes */
      PyObject* s = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)(n ? n - 1 : 0), NULL);
      free(buf);
      return s;
    }
    case OC_ATTR_INTS:
    case OC_ATTR_FLOATS: {
      size_t n = 0;
      int is_int = a->kind == OC_ATTR_INTS;
      st = is_int ? OC_API(g_api, KernelInfoGetAttributeArray_int64)(info, a->name, NULL, &n)
                  : OC_API(g_api, KernelInfoGetAttributeArray_float)(info, a->name, NULL, &n);
      if (st) { release_status(st); *missing = 1; return NULL; }
      void* buf = malloc((n ? n : 1) * 8);
      if (!buf) return PyErr_NoMemory();
      if (n) {
        st = is_int ? OC_API(g_api, KernelInfoGetAttributeArray_int64)(info, a->name, buf, &n)
                    : OC_API(g_api, KernelInfoGetAttributeArray_float)(info, a->name, buf, &n);
        if (st) { free(buf); release_status(st); *missing = 1; return NULL; }
      }
      PyObject* lst = PyList_New((Py_ssize_t)n);
      for (size_t i = 0; lst && i < n; i++) {
        PyObject* v = is_int ? PyLong_FromLongLong(((int64_t*)buf)[i])
                             : PyFloat_FromDouble((double)((float*)buf)[i]);
        PyList_SET_ITEM(lst, (Py_ssize_t)i, v);
      }
      free(buf);
      return lst;
    }
    case OC_ATTR_STRINGS: {
      if (g_api_version < OC_SINCE_KernelInfoGetAttributeArray_string) {
        PyErr_SetString(PyExc_RuntimeError,
                        "STRINGS attributes need onnxruntime >= 1.30 (KernelInfoGetAttributeArray_string)");
        return NULL;
      }
      /* ORT hands the strings back NUL-terminated, without lengths; the sizes it asks our
       * allocator for (length + 1 per string) keep NUL bytes inside the strings intact. */
      SizedAlloc al;
      if (sized_alloc_init(&al) < 0) return NULL;
      char** strs = NULL;
      size_t n = 0;
      /* our allocator has the OrtAllocator layout; ORT's own ones stay opaque (OrtAllocator) */
      st = OC_API(g_api, KernelInfoGetAttributeArray_string)(info, a->name, (OrtAllocator*)&al.abi, &strs, &n);
      if (st) { release_status(st); sized_alloc_done(&al); *missing = 1; return NULL; }
      PyObject* lst = PyList_New((Py_ssize_t)n);
      for (size_t i = 0; lst && i < n; i++) {
        size_t len = sized_alloc_length(&al, strs[i]);
        PyObject* v = PyUnicode_DecodeUTF8(strs[i] ? strs[i] : "", (Py_ssize_t)len, NULL);
        if (!v) { Py_CLEAR(lst); break; }
        PyList_SET_ITEM(lst, (Py_ssize_t)i, v);
      }
      sized_alloc_done(&al); /* frees the strings and the array too */
      return lst;
    }
    case OC_ATTR_TENSOR:
      return read_tensor_attr(info, a->name, missing);
    default:
      PyErr_Format(PyExc_RuntimeError, "unsupported attribute kind %d", a->kind);
      return NULL;
  }
}

/* Static output shapes ORT inferred for this node: used to reject wrongly shaped results. */
static void read_static_shapes(Kernel* k, const OrtKernelInfo* info) {
  size_t n = 0;
  OrtStatus* st = OC_API(g_api, KernelInfo_GetOutputCount)(info, &n);
  if (st) { release_status(st); return; }
  k->n_static = n;
  k->static_rank = calloc(n ? n : 1, sizeof(int64_t));
  k->static_dims = calloc(n ? n : 1, sizeof(int64_t*));
  for (size_t i = 0; i < n; i++) {
    k->static_rank[i] = -1;
    OrtTypeInfo* tinfo = NULL;
    st = OC_API(g_api, KernelInfo_GetOutputTypeInfo)(info, i, &tinfo);
    if (st) { release_status(st); continue; }
    const OrtTensorTypeAndShapeInfo* tsi = NULL;
    st = OC_API(g_api, CastTypeInfoToTensorInfo)(tinfo, &tsi);
    if (!st && tsi) {
      size_t r = 0;
      OrtStatus* s2 = OC_API(g_api, GetDimensionsCount)(tsi, &r);
      if (!s2 && r > 0) {
        int64_t* d = calloc(r, sizeof(int64_t));
        if (d && !(s2 = OC_API(g_api, GetDimensions)(tsi, d, r))) {
          k->static_rank[i] = (int64_t)r;
          k->static_dims[i] = d;
        } else {
          free(d);
        }
      }
      release_status(s2);
    }
    release_status(st);
    OC_API(g_api, ReleaseTypeInfo)(tinfo);
  }
}

/* Static element types of the node's inputs or outputs (0 where unknown or absent). */
static PyObject* read_elems(const OrtKernelInfo* info, int outputs) {
  size_t n = 0;
  OrtStatus* st = outputs ? OC_API(g_api, KernelInfo_GetOutputCount)(info, &n)
                          : OC_API(g_api, KernelInfo_GetInputCount)(info, &n);
  if (st) { release_status(st); n = 0; }
  PyObject* lst = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; lst && i < n; i++) {
    int elem = 0;
    OrtTypeInfo* tinfo = NULL;
    st = outputs ? OC_API(g_api, KernelInfo_GetOutputTypeInfo)(info, i, &tinfo)
                 : OC_API(g_api, KernelInfo_GetInputTypeInfo)(info, i, &tinfo);
    if (!st && tinfo) {
      const OrtTensorTypeAndShapeInfo* tsi = NULL;
      st = OC_API(g_api, CastTypeInfoToTensorInfo)(tinfo, &tsi);
      if (!st && tsi) st = OC_API(g_api, GetTensorElementType)(tsi, &elem);
      OC_API(g_api, ReleaseTypeInfo)(tinfo);
    }
    release_status(st);
    PyList_SET_ITEM(lst, (Py_ssize_t)i, PyLong_FromLong(elem));
  }
  return lst;
}

static char* read_node_name(const OrtKernelInfo* info) {
  size_t n = 0;
  OrtStatus* st = OC_API(g_api, KernelInfo_GetNodeName)(info, NULL, &n);
  char* buf = st ? NULL : malloc(n + 1);
  if (buf && !(st = OC_API(g_api, KernelInfo_GetNodeName)(info, buf, &n))) {
    buf[n ? n - 1 : 0] = '\0'; /* a node name is a C string; a NUL inside only shortens the label */
    return buf;
  }
  release_status(st);
  free(buf);
  return strdup("");
}

static OrtStatus* op_create_kernel_v2(const OcCustomOp* opp, const void* api, const OrtKernelInfo* info,
                                      void** out) {
  (void)api;
  Op* op = (Op*)opp; /* kernels count themselves on their op (live_kernels) */
  *out = NULL;
  if (!interpreter_alive()) return make_status(OC_ORT_FAIL, "onnx-custom: Python interpreter is shutting down");
  Kernel* k = calloc(1, sizeof(Kernel));
  if (!k) return make_status(OC_ORT_FAIL, "onnx-custom: out of memory");
  k->op = op;
  k->node = read_node_name(info);
  read_static_shapes(k, info);
  GilHold g;
  if (gil_enter(&g) < 0) {
    kernel_free(k);
    return make_status(OC_ORT_FAIL, "onnx-custom: cannot create a Python thread state for this thread");
  }
  OrtStatus* result = NULL;
  PyObject* attrs = NULL;
  PyObject* missing_list = NULL;
  PyObject* bound = NULL;
  PyObject* in_elems = NULL;
  PyObject* out_elems = NULL;
  if (!op->bind) {
    /* ORT kept this op past the SessionOptions it was registered with (and they are gone) */
    result = status_fmt(op, "kernel was released with the SessionOptions that registered it; fix: keep "
                        "the SessionOptions (or the session) alive while creating sessions from it");
    kernel_free(k);
    gil_exit(&g);
    return result;
  }
  attrs = PyDict_New();
  missing_list = PyList_New(0);
  in_elems = read_elems(info, 0);
  out_elems = read_elems(info, 1);
  for (size_t i = 0; attrs && missing_list && i < op->n_attrs; i++) {
    int missing = 0;
    PyObject* v = read_kernel_attr(info, &op->attrs[i], &missing);
    if (v) {
      PyDict_SetItemString(attrs, op->attrs[i].name, v);
      Py_DECREF(v);
    } else if (missing) {
      PyObject* nm = PyUnicode_FromString(op->attrs[i].name);
      PyList_Append(missing_list, nm);
      Py_XDECREF(nm);
    } else {
      goto error;
    }
  }
  if (!attrs || !missing_list || !in_elems || !out_elems) goto error;
  bound = PyObject_CallFunctionObjArgs(op->bind, attrs, missing_list, in_elems, out_elems, NULL);
  if (!bound) goto error;
  if (!PyTuple_Check(bound) || PyTuple_GET_SIZE(bound) != 3) {
    PyErr_SetString(PyExc_TypeError, "internal: bind() must return (fn, kwargs, shape_fn)");
    goto error;
  }
  k->fn = PyTuple_GET_ITEM(bound, 0);
  k->kwargs = PyTuple_GET_ITEM(bound, 1);
  k->shape_fn = PyTuple_GET_ITEM(bound, 2);
  Py_INCREF(k->fn);
  Py_INCREF(k->kwargs);
  Py_INCREF(k->shape_fn);
  op->live_kernels++;
  *out = k;
  goto done;
error:
  result = status_from_pyerr(op, k->node);
  kernel_free(k);
done:
  Py_XDECREF(bound);
  Py_XDECREF(attrs);
  Py_XDECREF(missing_list);
  Py_XDECREF(in_elems);
  Py_XDECREF(out_elems);
  gil_exit(&g);
  return result;
}

/* Element type, dims and data of one tensor OrtValue. */
static OrtStatus* tensor_view(const OrtValue* value, int* elem, int64_t* dims, size_t* rank, void** data) {
  OrtStatus* st;
  if (g_api_version >= OC_SINCE_GetTensorElementTypeAndShapeDataReference) {
    const int64_t* shp = NULL;
    size_t n = 0;
    st = OC_API(g_api, GetTensorElementTypeAndShapeDataReference)(value, elem, &shp, &n);
    if (st) return st;
    if (n > 32) return make_status(OC_ORT_FAIL, "onnx-custom: tensors of rank > 32 are not supported");
    if (n) memcpy(dims, shp, n * sizeof(int64_t));
    *rank = n;
  } else {
    OrtTensorTypeAndShapeInfo* info = NULL;
    st = OC_API(g_api, GetTensorTypeAndShape)(value, &info);
    if (st) return st;
    size_t n = 0;
    if (!(st = OC_API(g_api, GetTensorElementType)(info, elem)) &&
        !(st = OC_API(g_api, GetDimensionsCount)(info, &n))) {
      if (n > 32) {
        st = make_status(OC_ORT_FAIL, "onnx-custom: tensors of rank > 32 are not supported");
      } else {
        st = OC_API(g_api, GetDimensions)(info, dims, n);
        *rank = n;
      }
    }
    OC_API(g_api, ReleaseTensorTypeAndShapeInfo)(info);
    if (st) return st;
  }
  /* ORT's only data accessor before API 23 takes a mutable value; inputs are wrapped read-only */
  return OC_API(g_api, GetTensorMutableData)((OrtValue*)value, data);
}

static PyObject* wrap_array(int elem, const int64_t* dims, size_t rank, void* data, int writable) {
  PyObject* descr = (elem >= 0 && elem < 32) ? g_descr[elem] : NULL;
  if (!descr) {
    PyErr_Format(PyExc_TypeError, "tensor element type %d (ONNX TensorProto.DataType) has no numpy "
                 "equivalent here; supported: float16, bfloat16, float32, float64, int8-64, uint8-64, bool",
                 elem);
    return NULL;
  }
  npy_intp shp[32];
  for (size_t i = 0; i < rank; i++) shp[i] = (npy_intp)dims[i];
  Py_INCREF(descr); /* stolen by PyArray_NewFromDescr */
  int flags = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | (writable ? NPY_ARRAY_WRITEABLE : 0);
  int64_t count = 1;
  for (size_t i = 0; i < rank; i++) count *= dims[i];
  if (count == 0 || !data) {
    /* empty tensor: ORT may hand out NULL data; give numpy its own (empty) buffer */
    return PyArray_NewFromDescr(&PyArray_Type, (PyArray_Descr*)descr, (int)rank, shp, NULL, NULL, 0, NULL);
  }
  return PyArray_NewFromDescr(&PyArray_Type, (PyArray_Descr*)descr, (int)rank, shp, NULL, data, flags, NULL);
}

/* Shapes of the outputs for out= kernels, by rule; returns 0 on success, -1 with exception set. */
static int output_shapes(Kernel* k, PyObject* args, PyObject** in_arrays, size_t n_in, size_t n_out,
                         int64_t (*dims)[32], size_t* ranks) {
  const Op* op = k->op;
  if (op->rule == RULE_LIKE || op->rule == RULE_BROADCAST) {
    size_t first = op->rule == RULE_LIKE ? op->like_index : 0;
    if (first >= n_in || !in_arrays[first]) {
      PyErr_Format(PyExc_ValueError, "the output shape rule needs input %zu, which is absent", first);
      return -1;
    }
    int64_t res[32];
    size_t r = 0;
    int seen = 0;
    for (size_t i = first; i < n_in; i++) {
      if (!in_arrays[i]) continue;
      PyArrayObject* a = (PyArrayObject*)in_arrays[i];
      size_t ra = (size_t)PyArray_NDIM(a);
      if (!seen) {
        seen = 1;
        r = ra;
        for (size_t d = 0; d < ra; d++) res[d] = PyArray_DIMS(a)[d];
        if (op->rule == RULE_LIKE) break;
        continue;
      }
      size_t nr = ra > r ? ra : r;
      int64_t tmp[32];
      for (size_t d = 0; d < nr; d++) {
        int64_t x = d + r >= nr ? res[d + r - nr] : 1;
        int64_t y = d + ra >= nr ? PyArray_DIMS(a)[d + ra - nr] : 1;
        if (x != y && x != 1 && y != 1) {
          PyErr_Format(PyExc_ValueError, "inputs do not broadcast (dimension %zu: %lld vs %lld)", d,
                       (long long)x, (long long)y);
          return -1;
        }
        tmp[d] = x == 1 ? y : x;
      }
      r = nr;
      memcpy(res, tmp, nr * sizeof(int64_t));
    }
    for (size_t j = 0; j < n_out; j++) {
      ranks[j] = r;
      memcpy(dims[j], res, r * sizeof(int64_t));
    }
    return 0;
  }
  if (op->rule != RULE_PY || k->shape_fn == Py_None) {
    PyErr_SetString(PyExc_ValueError, "out= kernels need a shape rule to preallocate their outputs");
    return -1;
  }
  /* RULE_PY: shape_fn(args) -> sequence of shape tuples */
  PyObject* shapes = PyObject_CallOneArg(k->shape_fn, args);
  if (!shapes) return -1;
  PyObject* seq = PySequence_Fast(shapes, "shape function must return a sequence of shapes");
  Py_DECREF(shapes);
  if (!seq) return -1;
  if ((size_t)PySequence_Fast_GET_SIZE(seq) != n_out) {
    PyErr_Format(PyExc_ValueError, "shape function returned %zd shapes, expected %zu (one per output)",
                 PySequence_Fast_GET_SIZE(seq), n_out);
    Py_DECREF(seq);
    return -1;
  }
  for (size_t j = 0; j < n_out; j++) {
    PyObject* s = PySequence_Fast(PySequence_Fast_GET_ITEM(seq, j), "each shape must be a sequence of ints");
    if (!s) { Py_DECREF(seq); return -1; }
    Py_ssize_t r = PySequence_Fast_GET_SIZE(s);
    if (r > 32) { Py_DECREF(s); Py_DECREF(seq); PyErr_SetString(PyExc_ValueError, "rank > 32"); return -1; }
    for (Py_ssize_t d = 0; d < r; d++) {
      dims[j][d] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(s, d));
      if (dims[j][d] == -1 && PyErr_Occurred()) { Py_DECREF(s); Py_DECREF(seq); return -1; }
    }
    ranks[j] = (size_t)r;
    Py_DECREF(s);
  }
  Py_DECREF(seq);
  return 0;
}

static const char* descr_name(PyObject* descr, char* buf, size_t n) {
  PyObject* s = descr ? PyObject_Str(descr) : NULL;
  snprintf(buf, n, "%s", s ? PyUnicode_AsUTF8(s) : "?");
  Py_XDECREF(s);
  PyErr_Clear();
  return buf;
}

static void shape_text(const int64_t* d, size_t r, char* buf, size_t n) {
  size_t off = (size_t)snprintf(buf, n, "(");
  for (size_t i = 0; i < r && off < n; i++)
    off += (size_t)snprintf(buf + off, n - off, i + 1 < r || r == 1 ? "%lld," : "%lld", (long long)d[i]);
  if (off < n) snprintf(buf + off, n - off, ")");
}

/* Copies one returned value into ORT output j (allocated here, or preallocated when ov given). */
static OrtStatus* emit_output(Kernel* k, OrtKernelContext* ctx, size_t j, PyObject* value, OrtValue* ov) {
  const Op* op = k->op;
  if (value == Py_None || PyUnicode_Check(value) || PyBytes_Check(value) || PyDict_Check(value)) {
    return status_fmt(op, "output %zu is a %s; expected a numpy array (or a torch tensor with "
                      "tensor_type='torch')", j, Py_TYPE(value)->tp_name);
  }
  PyArrayObject* arr = (PyArrayObject*)PyArray_FROM_OF(value, NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED);
  if (!arr) return status_from_pyerr(op, k->node);
  size_t r = (size_t)PyArray_NDIM(arr);
  int64_t d[32];
  OrtStatus* st = NULL;
  if (r > 32) { Py_DECREF(arr); return status_fmt(op, "output %zu has rank > 32", j); }
  for (size_t i = 0; i < r; i++) d[i] = PyArray_DIMS(arr)[i];
  if (j < k->n_static && k->static_rank[j] >= 0) {
    int bad = (int64_t)r != k->static_rank[j];
    for (size_t i = 0; !bad && i < r; i++) bad = k->static_dims[j][i] >= 0 && k->static_dims[j][i] != d[i];
    if (bad) {
      char want[400], got[400];
      shape_text(k->static_dims[j], (size_t)k->static_rank[j], want, sizeof want);
      shape_text(d, r, got, sizeof got);
      Py_DECREF(arr);
      return status_fmt(op, "output %zu: expected shape %s (-1 = any), received %s; fix: return an "
                        "array of the inferred shape or correct the kernel's shape_fn", j, want, got);
    }
  }
  if (!ov) {
    st = OC_API(g_api, KernelContext_GetOutput)(ctx, j, d, r, &ov);
    if (st) { Py_DECREF(arr); return st; }
    if (!ov) { Py_DECREF(arr); return status_fmt(op, "ORT returned no buffer for output %zu", j); }
  }
  int elem = 0;
  int64_t od[32];
  size_t orank = 0;
  void* data = NULL;
  st = tensor_view(ov, &elem, od, &orank, &data);
  if (st) { Py_DECREF(arr); return st; }
  PyObject* want = (elem >= 0 && elem < 32) ? g_descr[elem] : NULL;
  if (!want || !PyArray_EquivTypes(PyArray_DESCR(arr), (PyArray_Descr*)want)) {
    char a[64], b[64];
    descr_name(want, a, sizeof a);
    descr_name((PyObject*)PyArray_DESCR(arr), b, sizeof b);
    Py_DECREF(arr);
    return status_fmt(op, "output %zu: expected dtype %s, received %s; fix: cast the result with "
                      ".astype(np.%s) or fix the kernel's shape_fn output dtype", j, a, b, a);
  }
  int same = orank == r;
  for (size_t i = 0; same && i < r; i++) same = od[i] == d[i];
  if (!same) {
    char want_s[400], got[400];
    shape_text(od, orank, want_s, sizeof want_s);
    shape_text(d, r, got, sizeof got);
    Py_DECREF(arr);
    return status_fmt(op, "output %zu: expected shape %s (preallocated), received %s", j, want_s, got);
  }
  size_t nbytes = (size_t)PyArray_NBYTES(arr);
  if (nbytes && data != PyArray_DATA(arr)) memcpy(data, PyArray_DATA(arr), nbytes);
  Py_DECREF(arr);
  return NULL;
}

static OrtStatus* compute_locked(Kernel* k, OrtKernelContext* ctx) {
  const Op* op = k->op;
  size_t n_in = 0, n_out = 0;
  OrtStatus* st = OC_API(g_api, KernelContext_GetInputCount)(ctx, &n_in);
  if (st) return st;
  if ((st = OC_API(g_api, KernelContext_GetOutputCount)(ctx, &n_out))) return st;
  if (n_in > 256 || n_out > 256) return status_fmt(op, "more than 256 inputs/outputs");
  PyObject* in_arrays[256];
  OrtValue* out_values[256];
  PyObject* args = PyTuple_New((Py_ssize_t)n_in);
  PyObject* result = NULL;
  PyObject* kwargs = NULL;
  if (!args) return status_from_pyerr(op, k->node);
  for (size_t i = 0; i < n_in; i++) {
    const OrtValue* v = NULL;
    in_arrays[i] = NULL;
    if ((st = OC_API(g_api, KernelContext_GetInput)(ctx, i, &v))) goto fail;
    if (!v) {
      Py_INCREF(Py_None);
      PyTuple_SET_ITEM(args, (Py_ssize_t)i, Py_None);
      continue;
    }
    int elem = 0;
    int64_t dims[32];
    size_t rank = 0;
    void* data = NULL;
    if ((st = tensor_view(v, &elem, dims, &rank, &data))) goto fail;
    PyObject* a = wrap_array(elem, dims, rank, data, 0);
    if (!a) { st = status_from_pyerr(op, k->node); goto fail; }
    PyTuple_SET_ITEM(args, (Py_ssize_t)i, a);
    in_arrays[i] = a;
  }
  if (op->out_mode) {
    int64_t dims[64][32];
    size_t ranks[64];
    if (n_out > 64) { st = status_fmt(op, "out= kernels support at most 64 outputs"); goto fail; }
    if (output_shapes(k, args, in_arrays, n_in, n_out, dims, ranks) < 0) { st = status_from_pyerr(op, k->node); goto fail; }
    PyObject* outs = PyTuple_New((Py_ssize_t)n_out);
    if (!outs) { st = status_from_pyerr(op, k->node); goto fail; }
    for (size_t j = 0; j < n_out; j++) {
      OrtValue* ov = NULL;
      if ((st = OC_API(g_api, KernelContext_GetOutput)(ctx, j, dims[j], ranks[j], &ov))) {
        Py_DECREF(outs);
        goto fail;
      }
      int elem = 0;
      int64_t od[32];
      size_t orank = 0;
      void* data = NULL;
      if (!ov || (st = tensor_view(ov, &elem, od, &orank, &data))) {
        if (!st) st = status_fmt(op, "ORT returned no buffer for output %zu", j);
        Py_DECREF(outs);
        goto fail;
      }
      out_values[j] = ov;
      PyObject* a = wrap_array(elem, od, orank, data, 1);
      if (!a) { Py_DECREF(outs); st = status_from_pyerr(op, k->node); goto fail; }
      PyTuple_SET_ITEM(outs, (Py_ssize_t)j, a);
    }
    kwargs = PyDict_Copy(k->kwargs);
    if (!kwargs || PyDict_SetItem(kwargs, g_out_key, outs) < 0) {
      Py_DECREF(outs);
      st = status_from_pyerr(op, k->node);
      goto fail;
    }
    Py_DECREF(outs);
    result = PyObject_Call(k->fn, args, kwargs);
    if (!result) { st = status_from_pyerr(op, k->node); goto fail; }
    if (result != Py_None) {
      /* the kernel returned values instead of (or after) writing: copy them over */
      PyObject* seq = (PyTuple_Check(result) || PyList_Check(result))
                          ? PySequence_Fast(result, "") : PyTuple_Pack(1, result);
      if (!seq) { st = status_from_pyerr(op, k->node); goto fail; }
      if ((size_t)PySequence_Fast_GET_SIZE(seq) != n_out) {
        st = status_fmt(op, "returned %zd outputs, expected %zu", PySequence_Fast_GET_SIZE(seq), n_out);
        Py_DECREF(seq);
        goto fail;
      }
      for (size_t j = 0; j < n_out && !st; j++) st = emit_output(k, ctx, j, PySequence_Fast_GET_ITEM(seq, j), out_values[j]);
      Py_DECREF(seq);
      if (st) goto fail;
    }
  } else {
    result = PyObject_Call(k->fn, args, k->kwargs);
    if (!result) { st = status_from_pyerr(op, k->node); goto fail; }
    PyObject* seq;
    if (PyTuple_Check(result) || PyList_Check(result)) {
      seq = PySequence_Fast(result, "");
    } else {
      seq = PyTuple_Pack(1, result);
    }
    if (!seq) { st = status_from_pyerr(op, k->node); goto fail; }
    if ((size_t)PySequence_Fast_GET_SIZE(seq) != n_out) {
      st = status_fmt(op, "returned %zd output(s), expected %zu; fix: return one array per declared "
                      "output (a tuple when there are several)", PySequence_Fast_GET_SIZE(seq), n_out);
      Py_DECREF(seq);
      goto fail;
    }
    for (size_t j = 0; j < n_out && !st; j++) {
      PyObject* item = PySequence_Fast_GET_ITEM(seq, j);
      if (item == Py_None) {
        st = status_fmt(op, "output %zu is None; fix: return an array for every output", j);
        break;
      }
      st = emit_output(k, ctx, j, item, NULL);
    }
    Py_DECREF(seq);
    if (st) goto fail;
  }
  Py_XDECREF(result);
  Py_XDECREF(kwargs);
  Py_DECREF(args);
  return NULL;
fail:
  Py_XDECREF(result);
  Py_XDECREF(kwargs);
  Py_DECREF(args);
  return st;
}

static OrtStatus* op_compute_v2(void* kp, OrtKernelContext* ctx) {
  Kernel* k = kp;
  if (!k) return make_status(OC_ORT_FAIL, "onnx-custom: kernel was not created");
  if (!interpreter_alive()) return make_status(OC_ORT_FAIL, "onnx-custom: Python interpreter is shutting down");
  GilHold g;
  if (gil_enter(&g) < 0) return make_status(OC_ORT_FAIL, "onnx-custom: cannot create a Python thread state for this thread");
  OrtStatus* st = compute_locked(k, ctx);
  gil_exit(&g);
  return st;
}

/* ---- ORT graph-time shape inference ------------------------------------------------------- */
/* Bytes ReadOpAttr counts beyond a STRING's length: 1 when it counts the terminating NUL (older
 * releases), 0 when not. Learned once from an attribute we make ourselves, so that the length
 * of a value with NUL bytes inside (or at its end) is exact either way. */
static int g_string_extra = -1;

static int string_extra(void) {
  if (g_string_extra >= 0) return g_string_extra;
  OrtOpAttr* attr = NULL;
  size_t need = 0;
  OrtStatus* st = OC_API(g_api, CreateOpAttr)("probe", "ab", 2, OC_ATTR_STRING, &attr);
  if (!st) {
    release_status(OC_API(g_api, ReadOpAttr)(attr, OC_ATTR_STRING, NULL, 0, &need));
    OC_API(g_api, ReleaseOpAttr)(attr);
  }
  release_status(st);
  g_string_extra = need == 2 ? 0 : 1;
  return g_string_extra;
}

static PyObject* read_infer_attr(const OrtShapeInferContext* ctx, const AttrDesc* a) {
  const OrtOpAttr* attr = NULL;
  OrtStatus* st = OC_API(g_api, ShapeInferContext_GetAttribute)(ctx, a->name, &attr);
  if (st || !attr) { release_status(st); Py_RETURN_NONE; }
  OcFn_ReadOpAttr rd = OC_API(g_api, ReadOpAttr);
  size_t need = 0;
  switch (a->kind) {
    case OC_ATTR_INT: {
      int64_t v = 0;
      if ((st = rd(attr, OC_ATTR_INT, &v, sizeof v, &need))) break;
      return PyLong_FromLongLong(v);
    }
    case OC_ATTR_FLOAT: {
      float v = 0;
      if ((st = rd(attr, OC_ATTR_FLOAT, &v, sizeof v, &need))) break;
      return PyFloat_FromDouble(v);
    }
    case OC_ATTR_STRING:
    case OC_ATTR_STRINGS:
    case OC_ATTR_INTS:
    case OC_ATTR_FLOATS: {
      st = rd(attr, a->kind, NULL, 0, &need);
      release_status(st);
      st = NULL;
      char* buf = calloc(need + 8, 1);
      if (!buf) break;
      if ((st = rd(attr, a->kind, buf, need, &need))) { free(buf); break; }
      PyObject* r = NULL;
      if (a->kind == OC_ATTR_STRING) {
        /* NUL bytes inside the value are kept: the length comes from ORT, not strlen */
        size_t extra = (size_t)string_extra();
        r = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)(need >= extra ? need - extra : 0), NULL);
      } else if (a->kind == OC_ATTR_STRINGS) {
        /* every string followed by a NUL, no lengths: the Python side splits (and resolves
         * strings that themselves contain NUL bytes against the model) */
        r = PyBytes_FromStringAndSize(buf, (Py_ssize_t)need);
      } else {
        size_t n = need / (a->kind == OC_ATTR_INTS ? sizeof(int64_t) : sizeof(float));
        r = PyList_New((Py_ssize_t)n);
        for (size_t i = 0; r && i < n; i++)
          PyList_SET_ITEM(r, (Py_ssize_t)i, a->kind == OC_ATTR_INTS ? PyLong_FromLongLong(((int64_t*)buf)[i])
                                                                 : PyFloat_FromDouble(((float*)buf)[i]));
      }
      free(buf);
      return r;
    }
    default:
      break;
  }
  release_status(st);
  PyErr_Clear();
  Py_RETURN_NONE; /* unreadable here: the Python side substitutes the default */
}

static OrtStatus* infer_locked(const Op* op, OrtShapeInferContext* ctx) {
  size_t n_in = 0;
  OrtStatus* st = OC_API(g_api, ShapeInferContext_GetInputCount)(ctx, &n_in);
  if (st) return st;
  PyObject* inputs = PyList_New((Py_ssize_t)n_in);
  PyObject* attrs = PyDict_New();
  PyObject* res = NULL;
  PyObject* seq = NULL;
  if (!inputs || !attrs) goto pyfail;
  for (size_t i = 0; i < n_in; i++) {
    OrtTensorTypeAndShapeInfo* info = NULL;
    st = OC_API(g_api, ShapeInferContext_GetInputTypeShape)(ctx, i, &info);
    if (st || !info) {
      release_status(st);
      st = NULL;
      Py_INCREF(Py_None);
      PyList_SET_ITEM(inputs, (Py_ssize_t)i, Py_None);
      continue;
    }
    int elem = 0;
    size_t r = 0;
    PyObject* item = NULL;
    if (!(st = OC_API(g_api, GetTensorElementType)(info, &elem)) &&
        !(st = OC_API(g_api, GetDimensionsCount)(info, &r))) {
      int64_t* d = calloc(r ? r : 1, sizeof(int64_t));
      const char** sym = calloc(r ? r : 1, sizeof(char*));
      if (d && sym && !(st = OC_API(g_api, GetDimensions)(info, d, r)) &&
          !(st = OC_API(g_api, GetSymbolicDimensions)(info, sym, r))) {
        /* rank 0 is also what an input of unknown rank reports: ask whether a shape exists */
        int has_shape = r > 0 || g_api_version < OC_SINCE_TensorTypeAndShape_HasShape ||
                        OC_API(g_api, TensorTypeAndShape_HasShape)(info);
        PyObject* shp = has_shape ? PyTuple_New((Py_ssize_t)r) : (Py_INCREF(Py_None), Py_None);
        for (size_t q = 0; has_shape && shp && q < r; q++) {
          PyObject* dv;
          if (d[q] >= 0) dv = PyLong_FromLongLong(d[q]);
          else if (sym[q] && sym[q][0]) dv = PyUnicode_FromString(sym[q]);
          else { dv = Py_None; Py_INCREF(dv); }
          PyTuple_SET_ITEM(shp, (Py_ssize_t)q, dv);
        }
        item = shp ? Py_BuildValue("(iN)", elem, shp) : NULL;
      }
      free(d);
      free(sym);
    }
    /* info belongs to the context (ORT frees it); releasing it here would double-free */
    if (st) goto fail;
    if (!item) goto pyfail;
    PyList_SET_ITEM(inputs, (Py_ssize_t)i, item);
  }
  for (size_t i = 0; i < op->n_attrs; i++) {
    PyObject* v = read_infer_attr(ctx, &op->attrs[i]);
    if (!v) goto pyfail;
    PyDict_SetItemString(attrs, op->attrs[i].name, v);
    Py_DECREF(v);
  }
  res = PyObject_CallFunctionObjArgs(op->infer, inputs, attrs, NULL);
  if (!res) goto pyfail;
  seq = PySequence_Fast(res, "infer must return a list");
  if (!seq) goto pyfail;
  for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(seq); j++) {
    PyObject* item = PySequence_Fast_GET_ITEM(seq, j);
    int elem = 0;
    PyObject* shp = NULL;
    if (item == Py_None) continue;
    if (!PyArg_ParseTuple(item, "iO", &elem, &shp)) goto pyfail;
    /* Shape unknown: ORT can only be told a type together with a shape (an info without dims
     * reads as a scalar), so claim nothing; ORT then types the output itself (see
     * host._ort_guess) and keeps whatever shape the model's value_info records. */
    if (shp == Py_None) continue;
    OrtTensorTypeAndShapeInfo* info = NULL;
    if ((st = OC_API(g_api, CreateTensorTypeAndShapeInfo)(&info))) goto fail;
    st = OC_API(g_api, SetTensorElementType)(info, elem);
    if (!st && shp != Py_None) {
      Py_ssize_t r = PyTuple_Size(shp);
      int64_t d[64];
      const char* sym[64];
      if (r < 0 || r > 64) {
        OC_API(g_api, ReleaseTensorTypeAndShapeInfo)(info);
        PyErr_Clear();
        st = status_fmt(op, "shape function returned a bad shape for output %zd", j);
        goto fail;
      }
      int has_sym = 0;
      for (Py_ssize_t q = 0; q < r; q++) {
        PyObject* dv = PyTuple_GET_ITEM(shp, q);
        sym[q] = "";
        if (PyLong_Check(dv)) d[q] = PyLong_AsLongLong(dv);
        else {
          d[q] = -1;
          if (PyUnicode_Check(dv)) { sym[q] = PyUnicode_AsUTF8(dv); has_sym = 1; }
        }
      }
      st = OC_API(g_api, SetDimensions)(info, d, (size_t)r);
      if (!st && has_sym) st = OC_API(g_api, SetSymbolicDimensions)(info, sym, (size_t)r);
    }
    if (!st) st = OC_API(g_api, ShapeInferContext_SetOutputTypeShape)(ctx, (size_t)j, info);
    OC_API(g_api, ReleaseTensorTypeAndShapeInfo)(info);
    if (st) goto fail;
  }
  Py_DECREF(seq);
  Py_DECREF(res);
  Py_DECREF(inputs);
  Py_DECREF(attrs);
  return NULL;
pyfail:
  st = status_from_pyerr(op, "");
fail:
  Py_XDECREF(seq);
  Py_XDECREF(res);
  Py_XDECREF(inputs);
  Py_XDECREF(attrs);
  return st;
}

static OrtStatus* op_infer(const OcCustomOp* opp, OrtShapeInferContext* ctx) {
  if (!interpreter_alive()) return make_status(OC_ORT_FAIL, "onnx-custom: Python interpreter is shutting down");
  GilHold g;
  if (gil_enter(&g) < 0) return make_status(OC_ORT_FAIL, "onnx-custom: cannot create a Python thread state for this thread");
  const Op* op = op_of(opp);
  OrtStatus* st = op->infer ? infer_locked(op, ctx) : NULL; /* released op: claim nothing */
  gil_exit(&g);
  return st;
}

/* ---- registration ------------------------------------------------------------------------- */
/* OrtCustomOpDomain objects are shared between SessionOptions registering the same op set and
 * counted: each registration holds one reference, which the Python side drops (domain_release)
 * when those SessionOptions are garbage collected. ORT reads a domain only while building a
 * session from the options, and every session keeps its options alive on the Python side. */
typedef struct DomainEntry {
  char* key;          /* domain name + op pointers, identifies a cached OrtCustomOpDomain */
  OrtCustomOpDomain* domain;
  long users;
  struct DomainEntry* next;
} DomainEntry;

typedef struct Pending {
  char* name;
  size_t n_ops;
  Op** ops;
} Pending;

static DomainEntry* g_domains = NULL;
static pthread_mutex_t g_domains_mu = PTHREAD_MUTEX_INITIALIZER;
static OrtCustomOpDomain* g_registered[256];    /* domains added by the last RegisterCustomOps call */
static size_t g_n_registered = 0;
static Pending* g_pending = NULL;
static size_t g_n_pending = 0;
static PyThread_type_lock g_lock = NULL;

static void clear_pending(void) {
  for (size_t i = 0; i < g_n_pending; i++) {
    free(g_pending[i].name);
    free(g_pending[i].ops);
  }
  free(g_pending);
  g_pending = NULL;
  g_n_pending = 0;
}

/* With g_domains_mu held: the cached domain for this op set, created (users 0) if needed. */
static OrtStatus* domain_for(const Pending* p, DomainEntry** out) {
  size_t klen = strlen(p->name) + 1 + p->n_ops * 20 + 1;
  char* key = malloc(klen);
  if (!key) return make_status(OC_ORT_FAIL, "onnx-custom: out of memory");
  size_t off = (size_t)snprintf(key, klen, "%s|", p->name);
  for (size_t j = 0; j < p->n_ops; j++) off += (size_t)snprintf(key + off, klen - off, "%p,", (void*)p->ops[j]);
  DomainEntry* e = g_domains;
  while (e && strcmp(e->key, key) != 0) e = e->next;
  if (e) {
    free(key);
    *out = e;
    return NULL;
  }
  OrtCustomOpDomain* dom = NULL;
  OrtStatus* st = OC_API(g_api, CreateCustomOpDomain)(p->name, &dom);
  for (size_t j = 0; j < p->n_ops && !st; j++) st = OC_API(g_api, CustomOpDomain_Add)(dom, &p->ops[j]->abi);
  e = st ? NULL : calloc(1, sizeof(DomainEntry));
  if (!e) {
    free(key);
    if (dom) OC_API(g_api, ReleaseCustomOpDomain)(dom); /* never handed to ORT's options */
    return st ? st : make_status(OC_ORT_FAIL, "onnx-custom: out of memory");
  }
  e->key = key;
  e->domain = dom;
  e->next = g_domains;
  g_domains = e;
  *out = e;
  return NULL;
}

__attribute__((visibility("default"))) OrtStatus* RegisterCustomOps(OrtSessionOptions* options,
                                                                    const OcOrtApiBase* base) {
  const void* api = base->GetApi(SHIM_API_VERSION);
  int ver = SHIM_API_VERSION;
  if (!api) { api = base->GetApi(SHIM_API_FALLBACK); ver = SHIM_API_FALLBACK; }
  if (!api) return NULL; /* cannot even create a status; ORT is older than 1.17 */
  g_api = api;
  g_api_version = ver;
  OrtStatus* st = NULL;
  g_n_registered = 0;
  pthread_mutex_lock(&g_domains_mu);
  for (size_t i = 0; i < g_n_pending && !st; i++) {
    DomainEntry* e = NULL;
    if ((st = domain_for(&g_pending[i], &e))) break;
    if (g_n_registered == sizeof g_registered / sizeof g_registered[0]) {
      st = make_status(OC_ORT_FAIL, "onnx-custom: more than 256 custom-op domains in one registration");
      break;
    }
    if ((st = OC_API(g_api, AddCustomOpDomain)(options, e->domain))) break;
    e->users++;
    g_registered[g_n_registered++] = e->domain;
  }
  pthread_mutex_unlock(&g_domains_mu);
  clear_pending();
  return st;
}
/* the entry point has exactly the signature ORT calls it with */
_Static_assert(__builtin_types_compatible_p(__typeof__(&RegisterCustomOps), OcFn_RegisterCustomOps),
               "RegisterCustomOps must match OcFn_RegisterCustomOps");

/* take_registered() -> [domain_address, ...]: what the last registration added (one reference each). */
static PyObject* py_take_registered(PyObject* self, PyObject* noargs) {
  (void)self; (void)noargs;
  PyObject* lst = PyList_New((Py_ssize_t)g_n_registered);
  for (size_t i = 0; lst && i < g_n_registered; i++) {
    PyObject* v = PyLong_FromVoidPtr(g_registered[i]);
    if (!v) { Py_CLEAR(lst); break; }
    PyList_SET_ITEM(lst, (Py_ssize_t)i, v);
  }
  g_n_registered = 0;
  return lst;
}

/* domain_release(address): drops one reference; the last one releases the OrtCustomOpDomain. */
static PyObject* py_domain_release(PyObject* self, PyObject* arg) {
  (void)self;
  void* dom = PyLong_AsVoidPtr(arg);
  if (!dom && PyErr_Occurred()) return NULL;
  if (g_shutdown || !g_api) Py_RETURN_NONE;
  pthread_mutex_lock(&g_domains_mu);
  DomainEntry** link = &g_domains;
  while (*link && (*link)->domain != dom) link = &(*link)->next;
  DomainEntry* e = *link;
  if (e && --e->users <= 0) {
    *link = e->next;
    OC_API(g_api, ReleaseCustomOpDomain)(e->domain);
    free(e->key);
    free(e);
  }
  pthread_mutex_unlock(&g_domains_mu);
  Py_RETURN_NONE;
}

/* ---- Python module ------------------------------------------------------------------------ */
static char* dup_utf8(PyObject* s) {
  const char* c = PyUnicode_AsUTF8(s);
  return c ? strdup(c) : NULL;
}

static int* int_array(PyObject* seq, size_t n) {
  int* out = calloc(n + 1, sizeof(int));
  for (size_t i = 0; out && i < n; i++) {
    PyObject* v = PySequence_GetItem(seq, (Py_ssize_t)i);
    out[i] = v ? (int)PyLong_AsLong(v) : 0;
    Py_XDECREF(v);
  }
  return out;
}

/* make_op(name, qualname, in_chars, out_chars, in_types, out_types, attrs[(name, kind)], rule,
 *         like_index, out_mode, bind, infer) -> address */
static PyObject* py_make_op(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *name, *qualname, *in_chars, *out_chars, *in_types, *out_types, *attrs, *bind, *infer;
  int rule, out_mode;
  Py_ssize_t like_index;
  if (!PyArg_ParseTuple(args, "UUOOOOOinpOO", &name, &qualname, &in_chars, &out_chars, &in_types, &out_types,
                        &attrs, &rule, &like_index, &out_mode, &bind, &infer))
    return NULL;
  Op* op = calloc(1, sizeof(Op));
  if (!op) return PyErr_NoMemory();
  op->name = dup_utf8(name);
  op->qualname = dup_utf8(qualname);
  op->n_in = (size_t)PySequence_Size(in_chars);
  op->n_out = (size_t)PySequence_Size(out_chars);
  op->in_char = int_array(in_chars, op->n_in);
  op->out_char = int_array(out_chars, op->n_out);
  op->in_type = int_array(in_types, op->n_in);
  op->out_type = int_array(out_types, op->n_out);
  op->n_attrs = (size_t)PySequence_Size(attrs);
  op->attrs = calloc(op->n_attrs + 1, sizeof(AttrDesc));
  for (size_t i = 0; op->attrs && i < op->n_attrs; i++) {
    PyObject* t = PySequence_GetItem(attrs, (Py_ssize_t)i);
    PyObject* nm = t ? PySequence_GetItem(t, 0) : NULL;
    PyObject* kd = t ? PySequence_GetItem(t, 1) : NULL;
    op->attrs[i].name = nm ? dup_utf8(nm) : strdup("?");
    op->attrs[i].kind = kd ? (int)PyLong_AsLong(kd) : 0;
    Py_XDECREF(nm);
    Py_XDECREF(kd);
    Py_XDECREF(t);
  }
  if (PyErr_Occurred() || !op->name || !op->qualname || !op->in_char || !op->out_char || !op->in_type || !op->out_type ||
      !op->attrs || like_index < 0) {
    op_free_struct(op);
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_MemoryError, "onnx-custom: cannot describe the op");
    return NULL;
  }
  op->rule = rule;
  op->like_index = (size_t)like_index;
  op->out_mode = out_mode;
  Py_INCREF(bind);
  Py_INCREF(infer);
  op->bind = bind;
  op->infer = infer;
  OcCustomOp* a = &op->abi;
  a->version = OC_CUSTOM_OP_VERSION;
  a->CreateKernel = op_create_kernel_v1;
  a->GetName = op_get_name;
  a->GetExecutionProviderType = op_get_ep;
  a->GetInputType = op_in_type;
  a->GetInputTypeCount = op_in_count;
  a->GetOutputType = op_out_type;
  a->GetOutputTypeCount = op_out_count;
  a->KernelCompute = op_compute_v1;
  a->KernelDestroy = op_kernel_destroy;
  a->GetInputCharacteristic = op_in_char;
  a->GetOutputCharacteristic = op_out_char;
  a->GetInputMemoryType = op_mem_default;
  a->GetVariadicInputMinArity = op_one;
  a->GetVariadicInputHomogeneity = op_zero;
  a->GetVariadicOutputMinArity = op_one;
  a->GetVariadicOutputHomogeneity = op_zero;
  a->CreateKernelV2 = op_create_kernel_v2;
  a->KernelComputeV2 = op_compute_v2;
  a->InferOutputShapeFn = op_infer;
  a->GetStartVersion = op_one;
  a->GetEndVersion = op_end_version;
  a->GetMayInplace = op_no_pairs;
  a->ReleaseMayInplace = op_release_pairs;
  a->GetAliasMap = op_no_pairs;
  a->ReleaseAliasMap = op_release_pairs;
  return PyLong_FromVoidPtr(op);
}

static Op* op_arg(PyObject* arg) {
  Op* op = PyLong_AsVoidPtr(arg);
  if (!op && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "null op address");
  return op;
}

/* op_release(address): no SessionOptions uses the op any more; drop its Python callbacks. */
static PyObject* py_op_release(PyObject* self, PyObject* arg) {
  (void)self;
  Op* op = op_arg(arg);
  if (!op) return NULL;
  Py_CLEAR(op->bind);
  Py_CLEAR(op->infer);
  Py_RETURN_NONE;
}

/* op_revive(address, bind, infer): the op is registered again. */
static PyObject* py_op_revive(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *addr, *bind, *infer;
  if (!PyArg_ParseTuple(args, "OOO", &addr, &bind, &infer)) return NULL;
  Op* op = op_arg(addr);
  if (!op) return NULL;
  Py_INCREF(bind);
  Py_INCREF(infer);
  Py_XSETREF(op->bind, bind);
  Py_XSETREF(op->infer, infer);
  Py_RETURN_NONE;
}

/* op_free(address): Python forgets the op; freed now or when its last kernel is destroyed. */
static PyObject* py_op_free(PyObject* self, PyObject* arg) {
  (void)self;
  Op* op = op_arg(arg);
  if (!op) return NULL;
  if (op->live_kernels > 0) op->dead = 1;
  else op_free_struct(op);
  Py_RETURN_NONE;
}

/* thread_states() -> (created, deleted): Python thread states made for ORT's threads. */
static PyObject* py_thread_states(PyObject* self, PyObject* noargs) {
  (void)self; (void)noargs;
  return Py_BuildValue("(ll)", __atomic_load_n(&g_ts_created, __ATOMIC_RELAXED),
                       __atomic_load_n(&g_ts_deleted, __ATOMIC_RELAXED));
}

/* set_pending([(domain, [op_address, ...]), ...]): ops for the next RegisterCustomOps call. */
static PyObject* py_set_pending(PyObject* self, PyObject* arg) {
  (void)self;
  PyObject* seq = PySequence_Fast(arg, "expected a list of (domain, ops)");
  if (!seq) return NULL;
  clear_pending();
  g_n_registered = 0;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  g_pending = calloc((size_t)n + 1, sizeof(Pending));
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *dom, *ops;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "UO", &dom, &ops)) goto bad;
    PyObject* ops_seq = PySequence_Fast(ops, "ops must be a list");
    if (!ops_seq) goto bad;
    Pending* p = &g_pending[g_n_pending++];
    p->name = dup_utf8(dom);
    p->n_ops = (size_t)PySequence_Fast_GET_SIZE(ops_seq);
    p->ops = calloc(p->n_ops + 1, sizeof(Op*));
    for (size_t j = 0; j < p->n_ops; j++) p->ops[j] = PyLong_AsVoidPtr(PySequence_Fast_GET_ITEM(ops_seq, j));
    Py_DECREF(ops_seq);
    if (PyErr_Occurred()) goto bad;
  }
  Py_DECREF(seq);
  Py_RETURN_NONE;
bad:
  clear_pending();
  Py_DECREF(seq);
  return NULL;
}

/* init(descrs: dict[int, np.dtype], format_error) */
static PyObject* py_init(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *descrs, *fmt;
  if (!PyArg_ParseTuple(args, "O!O", &PyDict_Type, &descrs, &fmt)) return NULL;
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(descrs, &pos, &key, &value)) {
    long k = PyLong_AsLong(key);
    if (k < 0 || k >= 32) { PyErr_SetString(PyExc_ValueError, "element type out of range"); return NULL; }
    PyArray_Descr* d = NULL;
    if (!PyArray_DescrConverter(value, &d)) return NULL;
    Py_XSETREF(g_descr[k], (PyObject*)d);
  }
  Py_INCREF(fmt);
  Py_XSETREF(g_format_error, fmt);
  Py_RETURN_NONE;
}

/* shutdown(): interpreter exit (atexit). From here on nothing calls into Python. */
static PyObject* py_shutdown(PyObject* self, PyObject* noargs) {
  (void)self; (void)noargs;
  g_shutdown = 1;
  pthread_mutex_lock(&g_reap_mu);
  int running = g_reaper_running;
  g_reaper_stop = 1;
  pthread_cond_broadcast(&g_reap_cv);
  pthread_mutex_unlock(&g_reap_mu);
  if (running) {
    /* the reaper may be waiting for the GIL to finish one last thread state */
    Py_BEGIN_ALLOW_THREADS
    pthread_join(g_reaper, NULL);
    Py_END_ALLOW_THREADS
    g_reaper_running = 0;
  }
  Py_RETURN_NONE;
}

static PyObject* py_api_version(PyObject* self, PyObject* noargs) {
  (void)self; (void)noargs;
  return PyLong_FromLong(g_api_version);
}

static PyObject* py_lock(PyObject* self, PyObject* noargs) {
  (void)self; (void)noargs;
  Py_BEGIN_ALLOW_THREADS
  PyThread_acquire_lock(g_lock, WAIT_LOCK);
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

static PyObject* py_unlock(PyObject* self, PyObject* noargs) {
  (void)self; (void)noargs;
  clear_pending();
  PyThread_release_lock(g_lock);
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"init", py_init, METH_VARARGS, "init(descrs, format_error)"},
    {"make_op", py_make_op, METH_VARARGS, "describe one custom op; returns its address"},
    {"set_pending", py_set_pending, METH_O, "queue ops for the next RegisterCustomOps call"},
    {"shutdown", py_shutdown, METH_NOARGS, "stop calling into Python (interpreter exit)"},
    {"take_registered", py_take_registered, METH_NOARGS, "domains added by the last registration"},
    {"domain_release", py_domain_release, METH_O, "drop one reference to a custom-op domain"},
    {"op_release", py_op_release, METH_O, "drop an op's Python callbacks (no options use it)"},
    {"op_revive", py_op_revive, METH_VARARGS, "give a released op its callbacks again"},
    {"op_free", py_op_free, METH_O, "forget an op (freed once no kernel of it is alive)"},
    {"thread_states", py_thread_states, METH_NOARGS, "(created, deleted) thread states for ORT threads"},
    {"api_version", py_api_version, METH_NOARGS, "OrtApi version in use (0 before first use)"},
    {"lock", py_lock, METH_NOARGS, "serialise registrations"},
    {"unlock", py_unlock, METH_NOARGS, "end a registration"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_onnx_custom_shim", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__onnx_custom_shim(void) {
  import_array();
  g_interp = PyInterpreterState_Get();
  if (pthread_key_create(&g_tstate_key, tstate_key_destructor) == 0) g_tstate_key_ok = 1;
  pthread_atfork(NULL, NULL, after_fork_child);
  g_lock = PyThread_allocate_lock();
  g_out_key = PyUnicode_InternFromString("out");
  return PyModule_Create(&moddef);
}
