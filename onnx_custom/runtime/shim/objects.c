/* onnx-custom kernel host, runtime/shim/objects.c: the Op/Kernel structs, globals, ORT statuses
 * from Python errors. Not compiled alone: runtime/shim.c includes every part in order, as one
 * translation unit. */

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

static int interpreter_alive(void) {
  return !g_shutdown && Py_IsInitialized() && !OC_FINALIZING();
}
